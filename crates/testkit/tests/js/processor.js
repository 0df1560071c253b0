"use strict";
// One EventHubConsumerClient (@azure/event-hubs) with the blob checkpoint store
// (@azure/eventhubs-checkpointstore-blob), in its own process: the JavaScript twin of
// tests/python/processor.py, driven by crates/testkit/tests/blob_fleet. It balances the hub's
// partitions with the other processors sharing the container (Azurite), processes every event,
// checkpoints every `checkpoint_every`-th event of a partition (sequence numbers n with
// n % k == k - 1), and reports what it does as one JSON document per line on stdout:
//
//   {"kind": "ready", "namespace": "…"}                the namespace its blobs are keyed by
//   {"kind": "init", "partition": "3"}                  a partition was claimed
//   {"kind": "close", "partition": "3", "reason": …}    a partition was closed
//   {"kind": "event", "partition": "3", "seq": 7, "offset": "…"}
//   {"kind": "checkpoint", "partition": "3", "seq": 9, "offset": "…"}   written to the store
//   {"kind": "error", "partition": "3" | null, "error": "…"}
//   {"kind": "stopped"}                                 after "stop" on stdin
//
// It stops (subscription and client closed, which gives up its ownerships) on a line "stop".
//
// Usage: NODE_PATH=<repo>/.interop/node_modules node processor.js <json-arguments>
//   {"conn", "hub", "storage", "container", "checkpoint_every", "load_balancing_interval"}

const { EventHubConsumerClient, earliestEventPosition } = require("@azure/event-hubs");
const { BlobCheckpointStore } = require("@azure/eventhubs-checkpointstore-blob");
const { ContainerClient } = require("@azure/storage-blob");

function emit(doc) {
  process.stdout.write(JSON.stringify(doc) + "\n");
}

function stopRequested() {
  return new Promise((resolve) => {
    let buffered = "";
    process.stdin.on("data", (chunk) => {
      buffered += chunk.toString();
      if (buffered.split("\n").some((line) => line.trim() === "stop")) resolve();
    });
    process.stdin.on("end", resolve);
  });
}

async function main() {
  const args = JSON.parse(process.argv[2]);
  const containerClient = new ContainerClient(args.storage, args.container);
  await containerClient.createIfNotExists();
  const intervalMs = Math.round(1000 * (args.load_balancing_interval ?? 1.0));
  const client = new EventHubConsumerClient(
    "$Default",
    args.conn,
    args.hub,
    new BlobCheckpointStore(containerClient),
    {
      loadBalancingOptions: {
        updateIntervalInMs: intervalMs,
        partitionOwnershipExpirationIntervalInMs: intervalMs * 10,
      },
    },
  );
  const every = args.checkpoint_every ?? 5;
  const subscription = client.subscribe(
    {
      processInitialize: async (context) => emit({ kind: "init", partition: context.partitionId }),
      processClose: async (reason, context) =>
        emit({ kind: "close", partition: context.partitionId, reason: String(reason) }),
      processEvents: async (events, context) => {
        for (const event of events) {
          const seq = event.sequenceNumber;
          const offset = String(event.offset);
          emit({ kind: "event", partition: context.partitionId, seq, offset });
          if (seq % every === every - 1) {
            await context.updateCheckpoint(event);
            emit({ kind: "checkpoint", partition: context.partitionId, seq, offset });
          }
        }
      },
      processError: async (error, context) =>
        emit({ kind: "error", partition: context.partitionId ?? null, error: String(error) }),
    },
    { startPosition: earliestEventPosition, maxWaitTimeInSeconds: 1 },
  );
  emit({ kind: "ready", namespace: client.fullyQualifiedNamespace });
  await stopRequested();
  await subscription.close();
  await client.close();
  emit({ kind: "stopped" });
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`processor.js failed: ${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
