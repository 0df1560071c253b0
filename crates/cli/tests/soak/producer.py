"""A producer of the crash soak (crates/cli/tests/soak.rs): the official azure-eventhub SDK
sending keyed batches to a `tributary serve` that the soak kills with SIGKILL at random moments.

Every batch's outcome is appended to a record file as one JSON line, flushed and fsynced before
the next batch is sent: {"p": producer, "s": first sequence, "n": events, "k": key, "ok": bool}.
An event's body is "<producer>/<sequence>/<key>", and its application properties "producer" and
"key" say the same (every event of a batch repeats them, as a replication task's stamps do). The SDK's own retries are off (retry_total=0):
a retried batch that the hub had stored before its acknowledgement was lost would be stored
twice, and the soak wants every outcome the producer saw, not the SDK's second try. After a
failure the client is closed and a new one made, as an application would.

Usage: producer.py <json-arguments>   (conn, hub, name, keys, seed, batch_max, record, stop)
Runs until the file `stop` exists, then prints one JSON document: batches, acknowledged, failed.
"""

import json
import os
import random
import sys
import time

from azure.eventhub import EventData, EventHubProducerClient

# The application properties every event carries (the soak's checker reads them back).
PRODUCER = "producer"
KEY = "key"


def record(out, doc):
    out.write(json.dumps(doc) + "\n")
    out.flush()
    os.fsync(out.fileno())


def main():
    args = json.loads(sys.argv[1])
    name = args["name"]
    rng = random.Random(args["seed"])
    sequence = 0
    counts = {"batches": 0, "acknowledged": 0, "failed": 0}
    client = None
    with open(args["record"], "a", encoding="utf-8") as out:
        while not os.path.exists(args["stop"]):
            key = rng.choice(args["keys"])
            n = rng.randint(1, args["batch_max"])
            ok = False
            try:
                if client is None:
                    client = EventHubProducerClient.from_connection_string(
                        args["conn"], eventhub_name=args["hub"], retry_total=0)
                events = [EventData(f"{name}/{sequence + i}/{key}") for i in range(n)]
                for event in events:
                    event.properties = {PRODUCER: name, KEY: key}
                client.send_batch(events, partition_key=key)
                ok = True
            except Exception:  # noqa: BLE001 - a failed send is an outcome the soak records
                pass
            record(out, {"p": name, "s": sequence, "n": n, "k": key, "ok": ok})
            counts["batches"] += 1
            counts["acknowledged" if ok else "failed"] += 1
            sequence += n
            if not ok:
                try:
                    if client is not None:
                        client.close()
                except Exception:  # noqa: BLE001 - the connection is gone either way
                    pass
                client = None
                time.sleep(0.2)
    if client is not None:
        client.close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
