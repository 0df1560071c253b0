"use strict";
// Drives the official @azure/event-hubs JavaScript SDK (on rhea) against a Tributary AMQP
// listener.
//
// Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
// Rust interop tests (crates/amqp/tests/js_interop.rs) start the broker and the listener, run
// this script with NODE_PATH=<repo>/.interop/node_modules and assert on that document. Exit code
// 0 means the scenario ran (its outcome, success or an expected error, is in the JSON); anything
// else is a harness failure.
//
// Usage: node interop.js <command> <json-arguments>

const {
  EventHubConsumerClient,
  EventHubProducerClient,
  earliestEventPosition,
  latestEventPosition,
} = require("@azure/event-hubs");

const TIMEOUT_MS = 30000;

/**
 * The client options a scenario asks for: with `websocket`, AMQP over WebSockets (the SDK
 * always opens `wss://<endpoint>/$servicebus/websocket`) through `ws` to `endpoint` (the SDK's
 * `customEndpointAddress`), trusting the CA file `verify`; `max_retries`, the SDK's retries.
 */
function clientOptions(args) {
  const options = {};
  if (args.max_retries !== undefined) options.retryOptions = { maxRetries: args.max_retries };
  if (!args.websocket) return options;
  const ca = args.verify ? { ca: require("fs").readFileSync(args.verify) } : {};
  return {
    ...options,
    customEndpointAddress: args.endpoint,
    webSocketOptions: { webSocket: require("ws"), webSocketConstructorOptions: ca },
  };
}

function describeValue(value) {
  if (Buffer.isBuffer(value)) return ["Buffer", value.toString("hex")];
  if (value instanceof Date) return ["Date", value.getTime()];
  if (value === null) return ["null", null];
  return [typeof value, value];
}

function describeEvent(event) {
  const properties = {};
  for (const [k, v] of Object.entries(event.properties || {})) properties[k] = describeValue(v);
  const body = Buffer.isBuffer(event.body) ? event.body.toString("utf8") : event.body;
  return {
    body,
    sequence_number: event.sequenceNumber,
    offset: event.offset,
    enqueued_ms: event.enqueuedTimeUtc ? event.enqueuedTimeUtc.getTime() : null,
    partition_key: event.partitionKey ?? null,
    properties,
    content_type: event.contentType ?? null,
    correlation_id: event.correlationId ?? null,
    message_id: event.messageId ?? null,
  };
}

function errorDoc(error) {
  return {
    name: error?.name,
    code: error?.code,
    message: String(error?.message ?? error),
    retryable: error?.retryable,
    // An SDK's retry loop that gives up throws an AggregateError of every attempt's error.
    ...(Array.isArray(error?.errors) ? { errors: error.errors.map(errorDoc) } : {}),
  };
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Resolves when `predicate()` holds (checked every 20 ms), or false after `ms`. */
async function waitFor(predicate, ms = TIMEOUT_MS) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (predicate()) return true;
    await sleep(20);
  }
  return predicate();
}

function position(args) {
  switch (args.position ?? "earliest") {
    case "earliest":
      return earliestEventPosition;
    case "latest":
      return latestEventPosition;
    case "sequence":
      return { sequenceNumber: args.value, isInclusive: !!args.inclusive };
    case "offset":
      return { offset: args.value, isInclusive: !!args.inclusive };
    case "time":
      return { enqueuedOn: args.value };
    default:
      throw new Error(`unknown position ${args.position}`);
  }
}

/** Subscribes to one partition and collects what arrives. */
class Collector {
  constructor(client, args, options = {}) {
    this.events = [];
    this.errors = [];
    this.closes = [];
    this.subscription = client.subscribe(
      String(args.partition ?? "0"),
      {
        processEvents: async (events, _context) => {
          for (const e of events) this.events.push(describeEvent(e));
        },
        processError: async (error, _context) => {
          this.errors.push(errorDoc(error));
        },
        processClose: async (reason, _context) => {
          this.closes.push(reason);
        },
      },
      {
        startPosition: position(args),
        maxBatchSize: 50,
        maxWaitTimeInSeconds: 1,
        ...options,
      },
    );
  }

  result() {
    return { events: this.events, errors: this.errors, closes: this.closes };
  }
}

async function cmdProduce(args) {
  const client = new EventHubProducerClient(args.conn, args.hub);
  try {
    const hub = await client.getEventHubProperties();
    const ids = await client.getPartitionIds();
    const partitions = [];
    for (const id of ids) {
      const p = await client.getPartitionProperties(id);
      partitions.push({
        id: p.partitionId,
        begin: p.beginningSequenceNumber,
        last: p.lastEnqueuedSequenceNumber,
        offset: p.lastEnqueuedOffset,
        empty: p.isEmpty,
      });
    }

    let batch = await client.createBatch({ partitionKey: "alpha" });
    for (let i = 0; i < 3; i++) batch.tryAdd({ body: `key-${i}` });
    await client.sendBatch(batch);

    batch = await client.createBatch({ partitionId: "1" });
    batch.tryAdd({ body: "p1-a" });
    batch.tryAdd({ body: "p1-b" });
    await client.sendBatch(batch);

    await client.sendBatch([{ body: "single-keyed" }], { partitionKey: "beta" });
    await client.sendBatch([{ body: "list-0" }, { body: "list-1" }], { partitionId: "0" });
    // Round-robin: no partition, no key.
    await client.sendBatch([{ body: "anywhere" }]);

    const typed = {
      body: "typed",
      properties: {
        str: "text",
        int: 42,
        float: 2.5,
        bool: true,
        time: new Date(Date.UTC(2024, 4, 6, 7, 8, 9)),
      },
      contentType: "application/json",
      correlationId: "corr-1",
      messageId: "msg-1",
    };
    await client.sendBatch([typed], { partitionId: "2" });

    // Concurrent sends on one link: the SDK pipelines them (rhea does not wait per message).
    const many = [];
    for (let i = 0; i < 50; i++) many.push(client.sendBatch([{ body: `pipelined-${i}` }], { partitionId: "3" }));
    await Promise.all(many);

    return {
      ok: true,
      created_ms: hub.createdOn.getTime(),
      name: hub.name,
      partition_ids: ids,
      partitions,
    };
  } finally {
    await client.close();
  }
}

async function cmdReceive(args) {
  const group = args.group ?? "$default";
  const client = new EventHubConsumerClient(group, args.conn, args.hub, clientOptions(args));
  const collector = new Collector(client, args, { trackLastEnqueuedEventProperties: true });
  await waitFor(() => collector.events.length >= args.count || collector.errors.length > 0, args.timeout_ms);
  await collector.subscription.close();
  await client.close();
  return collector.result();
}

async function cmdSteal(args) {
  // Without a checkpoint store the SDK sends no epoch for ownerLevel 0, so the levels are 1 and 2.
  const clients = [0, 1, 2].map(() => new EventHubConsumerClient("$default", args.conn, args.hub));
  const [lowClient, highClient, lateClient] = clients;
  try {
    const low = new Collector(lowClient, { ...args, position: "earliest" }, { ownerLevel: 1 });
    const lowGot = await waitFor(() => low.events.length > 0);
    if (!lowGot) return { error: "the ownerLevel 1 subscriber got no event", low: low.result() };
    const high = new Collector(highClient, { ...args, position: "earliest" }, { ownerLevel: 2 });
    const stolen = await waitFor(() => low.errors.length > 0 && low.closes.length > 0);
    const highGot = await waitFor(() => high.events.length > 0);
    // The displaced subscriber stays displaced: nothing more arrives on it.
    const lowCount = low.events.length;
    await sleep(500);
    const lowAfter = low.events.length - lowCount;
    // A subscriber with a lower owner level than the current one is refused.
    const late = new Collector(lateClient, { ...args, position: "earliest" }, { ownerLevel: 1 });
    const refused = await waitFor(() => late.errors.length > 0);
    const result = {
      stolen,
      high_received: highGot,
      low_events_after_steal: lowAfter,
      late_refused: refused,
      low: low.result(),
      high: high.result(),
      late: late.result(),
    };
    for (const c of [high, low, late]) await c.subscription.close();
    return result;
  } finally {
    for (const c of clients) await c.close();
  }
}

async function cmdLarge(args) {
  // One event near the 1 MiB limit each way: rhea splits its transfer into the server's
  // max-frame-size; the server sends it back in one frame (rhea's own limit is 4 GiB).
  const producer = new EventHubProducerClient(args.conn, args.hub, clientOptions(args));
  const body = Buffer.alloc(args.size);
  for (let i = 0; i < body.length; i++) body[i] = i % 251;
  try {
    await producer.sendBatch([{ body }], { partitionId: "0" });
  } finally {
    await producer.close();
  }
  const consumer = new EventHubConsumerClient("$default", args.conn, args.hub, clientOptions(args));
  const got = [];
  const errors = [];
  const subscription = consumer.subscribe(
    "0",
    {
      processEvents: async (events) => {
        for (const e of events) got.push(e.body);
      },
      processError: async (error) => {
        errors.push(errorDoc(error));
      },
    },
    { startPosition: earliestEventPosition, maxBatchSize: 1, maxWaitTimeInSeconds: 1 },
  );
  await waitFor(() => got.length > 0 || errors.length > 0);
  await subscription.close();
  await consumer.close();
  const back = got[0];
  return {
    errors,
    received: got.length,
    size: back ? back.length : null,
    equal: back ? Buffer.compare(Buffer.from(back), body) === 0 : false,
  };
}

/**
 * Sends `bodies` to partition 0 and receives them back from the start; an error (a refused
 * certificate, say) is reported, not thrown. Over TLS the SDK trusts what NODE_EXTRA_CA_CERTS
 * names, as Node does for every TLS client.
 */
async function cmdRoundTrip(args) {
  const retryOptions = { maxRetries: 1, retryDelayInMs: 100, timeoutInMs: 10000 };
  const producer = new EventHubProducerClient(args.conn, args.hub, { retryOptions });
  try {
    const batch = await producer.createBatch({ partitionId: "0" });
    for (const body of args.bodies) batch.tryAdd({ body });
    await producer.sendBatch(batch);
  } catch (error) {
    return { sent: false, ...errorDoc(error) };
  } finally {
    await producer.close();
  }
  const client = new EventHubConsumerClient("$default", args.conn, args.hub, { retryOptions });
  const collector = new Collector(client, { ...args, position: "earliest", partition: 0 });
  await waitFor(() => collector.events.length >= args.bodies.length || collector.errors.length > 0);
  await collector.subscription.close();
  await client.close();
  return { sent: true, ...collector.result() };
}

/** Sends `count` events `<prefix>-<i>` in one batch to partition `partition`; the outcome. */
async function cmdSendBatch(args) {
  const client = new EventHubProducerClient(args.conn, args.hub, clientOptions(args));
  try {
    const batch = await client.createBatch({ partitionId: String(args.partition ?? "0") });
    for (let i = 0; i < args.count; i++) batch.tryAdd({ body: `${args.prefix}-${i}` });
    await client.sendBatch(batch);
    return { sent: true };
  } catch (error) {
    return { sent: false, ...errorDoc(error) };
  } finally {
    await client.close();
  }
}

/**
 * `producers` producers at once, each sending `batches` batches of `batch_events` events
 * (`<producer>-<batch>-<i>`) to partition `<producer>` of `hub`, one after another, with the SDK's
 * retries (`max_retries`, `retry_delay_ms`); each producer's outcome: batches sent, and the
 * first error that ended it (with its name and whether the SDK deems it retryable).
 */
async function cmdSendBusy(args) {
  const retryOptions = { maxRetries: args.max_retries, retryDelayInMs: args.retry_delay_ms };
  const producer = async (p) => {
    const client = new EventHubProducerClient(args.conn, args.hub, { retryOptions });
    let sent = 0;
    try {
      for (let b = 0; b < args.batches; b++) {
        const batch = await client.createBatch({ partitionId: String(p) });
        for (let i = 0; i < args.batch_events; i++) batch.tryAdd({ body: `${p}-${b}-${i}` });
        await client.sendBatch(batch);
        sent += 1;
      }
      return { sent };
    } catch (error) {
      return { sent, error: errorDoc(error) };
    } finally {
      await client.close();
    }
  };
  const ids = [...Array(args.producers).keys()];
  return { producers: await Promise.all(ids.map(producer)) };
}

const COMMANDS = {
  "send-busy": cmdSendBusy,
  produce: cmdProduce,
  receive: cmdReceive,
  steal: cmdSteal,
  large: cmdLarge,
  "round-trip": cmdRoundTrip,
  "send-batch": cmdSendBatch,
};

async function main() {
  const [command, raw] = process.argv.slice(2);
  const run = COMMANDS[command];
  if (!run) throw new Error(`unknown command ${command}`);
  const result = await run(JSON.parse(raw));
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(2);
  },
);
