// Drives kafkajs against Tributary's Kafka door, configured as for Event Hubs' Kafka endpoint:
// SASL PLAIN without TLS, user `$ConnectionString`, a connection string (or a SAS token) as the
// password. One run does every check and prints one JSON document (the last line of stdout);
// crates/testkit/tests/kafka_clients.rs starts the door, runs this and asserts on it. A check
// that fails records its error in the document; a non-zero exit is a harness failure.
//
// kafkajs reads gzip itself; snappy comes from kafkajs-snappy and lz4 from lz4js, registered as
// kafkajs documents for codecs (it has no zstd codec that builds on Node 20 without native
// code). kafkajs consumers always join a group: the records are read back by one, which commits
// what it read.
//
// Usage: node kafka_clients.js <json-arguments>
//   arguments: bootstrap, conns {root, token, listen, send, bad}, topic (3 partitions),
//   time_topic (1 partition), compressions, group (a consumer group id).

"use strict";

const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require("kafkajs");
const SnappyCodec = require("kafkajs-snappy");
const lz4 = require("lz4js");

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec;
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress(encoder) {
    return Buffer.from(lz4.compress(encoder.buffer));
  },
  async decompress(buffer) {
    return Buffer.from(lz4.decompress(buffer));
  },
});

const COMPRESSION = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
};
// Every record's CreateTime is this plus its index.
const BASE_TIMESTAMP = 1700000000000;
// Over the 1 MiB a record may hold (the door's limit, as Azure's).
const OVERSIZE = 1024 * 1024 + 1;

function client(args, password) {
  return new Kafka({
    clientId: "tributary-kafkajs-test",
    brokers: [args.bootstrap],
    ssl: false,
    sasl: { mechanism: "plain", username: "$ConnectionString", password },
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 2, initialRetryTime: 100 },
    logLevel: logLevel.NOTHING,
  });
}

function errorText(e) {
  const type = e.type ? ` ${e.type}` : "";
  return `${e.name}${type}: ${e.message}`;
}

// Runs `check`, returning what it returned or its error, and how long it took.
async function timed(check) {
  const started = Date.now();
  let outcome;
  try {
    outcome = { result: await check(), error: null };
  } catch (e) {
    outcome = { result: null, error: errorText(e) };
  }
  outcome.seconds = (Date.now() - started) / 1000;
  return outcome;
}

// The records the produce check sends (as kafka_clients.py plans them): for each acks setting
// and compression, two records to one partition; the second has no key.
function planned(compressions) {
  const plan = [];
  for (const [acks, partition] of [["0", 0], ["1", 1], ["all", 2]]) {
    for (const compression of compressions) {
      for (let i = 0; i < 2; i++) {
        const n = plan.length;
        plan.push({
          acks,
          compression,
          partition,
          value: `${acks}-${compression}-${i}`,
          key: i === 0 ? `key-${n}` : null,
          headers: { trace: "00ff10", n: Buffer.from(String(n)).toString("hex") },
          timestamp: BASE_TIMESTAMP + n,
        });
      }
    }
  }
  return plan;
}

function message(record) {
  const headers = {};
  for (const [k, v] of Object.entries(record.headers || {})) headers[k] = Buffer.from(v, "hex");
  return {
    value: record.value,
    key: record.key,
    partition: record.partition,
    headers,
    timestamp: record.timestamp === undefined ? undefined : String(record.timestamp),
  };
}

const ACKS = { 0: 0, 1: 1, all: -1 };

// One producer per acks setting and compression (idempotent with acks all); each record's
// offset (null with acks 0, which has no answer) or the send's error.
async function producePlan(args, plan) {
  const results = [];
  const groups = new Map();
  for (const record of plan) {
    const key = `${record.acks}/${record.compression}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(record);
  }
  for (const records of groups.values()) {
    const { acks, compression } = records[0];
    const idempotent = acks === "all";
    const producer = client(args, args.conns.root).producer({ idempotent, maxInFlightRequests: idempotent ? 1 : undefined });
    await producer.connect();
    try {
      const answer = await producer.send({
        topic: args.topic,
        acks: ACKS[acks],
        compression: COMPRESSION[compression],
        messages: records.map(message),
      });
      const base = answer.length ? Number(answer[0].baseOffset) : null;
      records.forEach((_, i) => results.push({ offset: base === null ? null : base + i, error: null }));
    } catch (e) {
      records.forEach(() => results.push({ offset: null, error: errorText(e) }));
    } finally {
      await producer.disconnect();
    }
  }
  return results;
}

// Each partition's earliest and latest offsets (ListOffsets), logged in with `password`.
async function offsets(args, password, topic) {
  const admin = client(args, password).admin();
  await admin.connect();
  try {
    const listed = await admin.fetchTopicOffsets(topic);
    const out = {};
    for (const p of listed) out[String(p.partition)] = [Number(p.low), Number(p.high)];
    return out;
  } finally {
    await admin.disconnect();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Produces two records, notes a time between them, and finds the second by that time.
async function byTime(args) {
  const producer = client(args, args.conns.root).producer();
  await producer.connect();
  let between;
  try {
    await producer.send({ topic: args.time_topic, acks: -1, messages: [{ value: "before", partition: 0 }] });
    await sleep(50);
    between = Date.now();
    await sleep(50);
    await producer.send({ topic: args.time_topic, acks: -1, messages: [{ value: "after", partition: 0 }] });
  } finally {
    await producer.disconnect();
  }
  const admin = client(args, args.conns.root).admin();
  await admin.connect();
  try {
    const found = await admin.fetchTopicOffsetsByTimestamp(args.time_topic, between);
    const later = await admin.fetchTopicOffsetsByTimestamp(args.time_topic, Date.now() + 60000);
    const read = await readFrom(args, found[0].offset);
    return { offset: Number(found[0].offset), after_the_end: Number(later[0].offset), read };
  } finally {
    await admin.disconnect();
  }
}

// A consumer (group `<group>-time`) that seeks partition 0 of the time topic to `offset` and
// returns the first record's value it reads there.
async function readFrom(args, offset) {
  const consumer = client(args, args.conns.root).consumer({ groupId: `${args.group}-time`, maxWaitTimeInMs: 100 });
  await consumer.connect();
  try {
    await consumer.subscribe({ topic: args.time_topic });
    return await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no record in 30 s")), 30000);
      consumer.run({
        autoCommit: false,
        eachMessage: async ({ message }) => {
          clearTimeout(timer);
          resolve(message.value.toString());
        },
      }).then(() => consumer.seek({ topic: args.time_topic, partition: 0, offset: String(offset) }), reject);
    });
  } finally {
    await consumer.disconnect();
  }
}

async function refusedProduce(args, password, record) {
  const producer = client(args, password).producer({ retry: { retries: 0 } });
  await producer.connect();
  try {
    await producer.send({ topic: args.topic, acks: -1, messages: [message(record)] });
  } finally {
    await producer.disconnect();
  }
}

async function badLogin(args) {
  const producer = client(args, args.conns.bad).producer();
  await producer.connect();
  await producer.disconnect();
}

function recordJson(partition, message) {
  const headers = {};
  for (const [k, v] of Object.entries(message.headers || {})) headers[k] = v === null ? null : Buffer.from(v).toString("hex");
  return {
    partition,
    offset: Number(message.offset),
    value: message.value === null ? null : message.value.toString(),
    key: message.key === null ? null : message.key.toString(),
    headers,
    timestamp: Number(message.timestamp),
  };
}

// Joins group `group` (logged in with a SAS token), reads `count` records from the beginning,
// commits the offset after each partition's last, and reads the group's commits back.
async function group(args, count) {
  const kafka = client(args, args.conns.token);
  const consumer = kafka.consumer({ groupId: args.group, maxWaitTimeInMs: 100 });
  await consumer.connect();
  const records = [];
  try {
    await consumer.subscribe({ topic: args.topic, fromBeginning: true });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${records.length} of ${count} records in 30 s`)), 30000);
      consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          records.push(recordJson(partition, message));
          if (records.length >= count) {
            clearTimeout(timer);
            resolve();
          }
        },
      }).catch(reject);
    });
    const next = {};
    for (const r of records) next[r.partition] = Math.max(next[r.partition] || 0, r.offset + 1);
    await consumer.commitOffsets(Object.entries(next).map(([partition, offset]) => ({ topic: args.topic, partition: Number(partition), offset: String(offset) })));
  } finally {
    await consumer.disconnect();
  }
  const admin = kafka.admin();
  await admin.connect();
  try {
    const fetched = await admin.fetchOffsets({ groupId: args.group, topics: [args.topic] });
    const committed = {};
    for (const p of fetched[0].partitions) committed[String(p.partition)] = Number(p.offset);
    return { records, committed };
  } finally {
    await admin.disconnect();
  }
}

async function main() {
  const args = JSON.parse(process.argv[2]);
  const compressions = args.compressions.filter((c) => c in COMPRESSION);
  const plan = planned(compressions);
  const version = require("kafkajs/package.json").version;
  const out = { client: `kafkajs ${version}`, plan };
  out.produced = await timed(() => producePlan(args, plan));
  out.by_time = await timed(() => byTime(args));
  out.oversize = await timed(() => refusedProduce(args, args.conns.root, { value: "x".repeat(OVERSIZE), partition: 0 }));
  out.no_send_right = await timed(() => refusedProduce(args, args.conns.listen, { value: "refused", partition: 0 }));
  out.no_listen_right = await timed(() => offsets(args, args.conns.send, args.topic));
  out.bad_credentials = await timed(() => badLogin(args));
  out.offsets = await timed(() => offsets(args, args.conns.token, args.topic));
  out.group = await timed(() => group(args, plan.length));
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
