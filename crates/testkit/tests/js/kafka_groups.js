// Drives kafkajs consumer groups against Tributary's Kafka door (SASL PLAIN with
// `$ConnectionString`, as Event Hubs' Kafka endpoint): the same rebalance scenario as
// tests/python/kafka_groups.py runs with librdkafka. Prints one JSON document (the last line of
// stdout); crates/testkit/tests/kafka_groups.rs starts the door, runs this and asserts on it. A
// non-zero exit is a harness failure.
//
// kafkajs has only the classic, eager protocol: on a rebalance every member gives up all its
// partitions (the REBALANCING event) before the group's new assignment (GROUP_JOIN).
//
// Usage: node kafka_groups.js rebalance <json-arguments>
//   arguments: bootstrap, conn, topic, partitions, group, records (per phase).

"use strict";

const { Kafka, logLevel } = require("kafkajs");

const TIMEOUT_MS = 60000;

function client(args, clientId) {
  return new Kafka({
    clientId,
    brokers: [args.bootstrap],
    ssl: false,
    sasl: { mechanism: "plain", username: "$ConnectionString", password: args.conn },
    connectionTimeout: 5000,
    requestTimeout: 10000,
    logLevel: logLevel.NOTHING,
  });
}

async function waitUntil(what, predicate) {
  const deadline = Date.now() + TIMEOUT_MS;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// One member of the group: what it is assigned, and every record it reads, in `shared`.
async function startMember(name, args, shared) {
  const member = { name, assigned: new Set(), stopped: false };
  const consumer = client(args, `kafkajs-${name}`).consumer({
    groupId: args.group,
    sessionTimeout: 6000,
    heartbeatInterval: 500,
    rebalanceTimeout: 10000,
  });
  member.consumer = consumer;
  consumer.on(consumer.events.REBALANCING, () => {
    for (const partition of member.assigned) {
      if (shared.owner.get(partition) === name) shared.owner.delete(partition);
    }
    member.assigned = new Set();
  });
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const partitions = payload.memberAssignment[args.topic] || [];
    for (const partition of partitions) {
      const owner = shared.owner.get(partition);
      if (owner !== undefined && owner !== name) {
        shared.violations.push(`${name} assigned partition ${partition} while ${owner} holds it`);
      }
      shared.owner.set(partition, name);
    }
    member.assigned = new Set(partitions);
  });
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    shared.errors.push(`${name}: ${payload.error.name}: ${payload.error.message}`);
  });
  await consumer.connect();
  await consumer.subscribe({ topic: args.topic, fromBeginning: true });
  await consumer.run({
    autoCommitThreshold: 1,
    eachMessage: async ({ partition, message }) => {
      const key = `${partition}/${message.offset}`;
      const owner = shared.owner.get(partition);
      if (owner !== name) {
        shared.violations.push(`${name} read ${key} while ${owner} holds the partition`);
      }
      if (shared.read.has(key)) {
        shared.violations.push(`${key} read by ${shared.read.get(key)} and ${name}`);
      }
      shared.read.set(key, name);
    },
  });
  return member;
}

// Stops `member`: it commits and leaves the group, and holds nothing after.
async function stopMember(member, shared) {
  member.stopped = true;
  await member.consumer.disconnect();
  for (const partition of member.assigned) {
    if (shared.owner.get(partition) === member.name) shared.owner.delete(partition);
  }
  member.assigned = new Set();
}

async function produce(args, count, start) {
  const producer = client(args, "kafkajs-producer").producer();
  await producer.connect();
  const byPartition = new Map();
  for (let i = 0; i < count; i++) {
    const partition = i % args.partitions;
    if (!byPartition.has(partition)) byPartition.set(partition, []);
    byPartition.get(partition).push({ value: String(start + i), partition });
  }
  await producer.sendBatch({
    acks: -1,
    topicMessages: [{ topic: args.topic, messages: [...byPartition.values()].flat() }],
  });
  await producer.disconnect();
}

// Three members share the topic; a fourth joins; the first leaves. Between steps, records are
// produced and every one must be read once, by the member holding its partition.
async function rebalance(args) {
  const shared = { owner: new Map(), read: new Map(), violations: [], errors: [] };
  const members = [];
  const phases = [];
  let produced = 0;
  const live = () => members.filter((m) => !m.stopped);
  const settled = (count) => {
    const sets = live().map((m) => m.assigned);
    const covered = new Set(sets.flatMap((s) => [...s]));
    return (
      sets.length === count &&
      sets.every((s) => s.size > 0) &&
      covered.size === args.partitions &&
      sets.reduce((n, s) => n + s.size, 0) === args.partitions
    );
  };
  const phase = async (count) => {
    await waitUntil(`${count} members share the partitions`, () => settled(count));
    await produce(args, args.records, produced);
    produced += args.records;
    await waitUntil(`all ${produced} records are read`, () => shared.read.size >= produced);
    const held = {};
    for (const m of live()) held[m.name] = [...m.assigned].sort((a, b) => a - b);
    phases.push(held);
  };
  for (const name of ["a", "b", "c"]) members.push(await startMember(name, args, shared));
  await phase(3);
  members.push(await startMember("d", args, shared));
  await phase(4);
  await stopMember(members[0], shared);
  await phase(3);
  for (const m of live()) await stopMember(m, shared);
  return {
    phases,
    read: shared.read.size,
    produced,
    violations: shared.violations,
    errors: shared.errors,
  };
}

const COMMANDS = { rebalance };

async function main() {
  const [command, json] = process.argv.slice(2);
  const out = await COMMANDS[command](JSON.parse(json));
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
