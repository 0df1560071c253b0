"""Sends above Tributary's throughput limits with the official clients, as a user would, and
reports what the clients saw: the azure-eventhub Python SDK over AMQP (a send refused with
com.microsoft:server-busy is waited out and sent again) and confluent-kafka over the Kafka door
(throttle_time_ms, reported through its throttle callback).

Each subcommand prints one JSON document on stdout (the last line);
crates/testkit/tests/throttle.rs starts the server, runs this script and asserts on it (and on
what the server stored). Exit code 0 means the scenario ran.

Usage: throttle.py amqp-send|kafka-produce|kafka-consume <json-arguments>
"""

import json
import logging
import os
import re
import sys
import threading
import time
import traceback

from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.exceptions import EventDataSendError
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

# How many times a refused batch is sent before the scenario gives up.
MAX_ATTEMPTS = 30


def send_until_accepted(producer, make_batch, busy):
    """Sends a batch; on `com.microsoft:server-busy` waits as the refusal says and sends it
    again. azure-eventhub's pyamqp transport (its default) raises a rejected delivery as
    EventDataSendError without retrying it (its uamqp transport retried server-busy), so
    this is what an application does."""
    for _ in range(MAX_ATTEMPTS):
        try:
            producer.send_batch(make_batch())
            return
        except EventDataSendError as e:
            text = str(e)
            if "com.microsoft:server-busy" not in text:
                raise
            wait = re.search(r"Please wait (\d+) seconds", text)
            busy.append(text)
            time.sleep(int(wait.group(1)) if wait else 4)
    raise RuntimeError(f"still refused after {MAX_ATTEMPTS} attempts")


def cmd_amqp_send(args):
    """`threads` producers, each sending `batches` batches of `batch_events` events to its own
    partition, as fast as the server takes them. Bodies are `<thread>-<batch>-<event>`."""
    results = [None] * args["threads"]

    def send(thread):
        producer = EventHubProducerClient.from_connection_string(args["conn"], eventhub_name=args["hub"])
        busy = []
        try:
            with producer:
                for b in range(args["batches"]):
                    def make_batch(b=b):
                        batch = producer.create_batch(partition_id=str(thread))
                        for e in range(args["batch_events"]):
                            batch.add(EventData(f"{thread}-{b}-{e}"))
                        return batch
                    send_until_accepted(producer, make_batch, busy)
            results[thread] = {"ok": True, "server_busy": len(busy), "first_refusal": busy[:1]}
        except Exception as e:  # noqa: BLE001 - reported to the test
            results[thread] = {"ok": False, "error": repr(e), "server_busy": len(busy)}

    started = time.monotonic()
    workers = [threading.Thread(target=send, args=(t,)) for t in range(args["threads"])]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {
        "elapsed_s": time.monotonic() - started,
        "threads": results,
    }


def cmd_kafka_produce(args):
    """Produces `count` records of `size` bytes to partition 0 of `topic`; reports the
    delivery errors and the throttle callbacks librdkafka made."""
    throttles = []

    def throttled(event):
        throttles.append(event.throttle_time * 1000.0)

    producer = Producer({
        "bootstrap.servers": args["bootstrap"],
        "socket.timeout.ms": 10000,
        "batch.size": args["batch_bytes"],
        "linger.ms": 5,
        "acks": "all",
        "throttle_cb": throttled,
    })
    errors = []

    def delivered(err, msg):
        if err:
            errors.append(err.name())

    payload = b"x" * args["size"]
    started = time.monotonic()
    for i in range(args["count"]):
        while True:
            try:
                producer.produce(args["topic"], value=payload, key=str(i).encode(),
                                 partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    return {
        "elapsed_s": time.monotonic() - started,
        "unflushed": left,
        "errors": errors,
        "throttles": len([t for t in throttles if t > 0]),
        "throttle_ms_max": max(throttles, default=0),
    }


def cmd_kafka_consume(args):
    """Reads `count` records of partition 0 of `topic` from the beginning; reports how many
    came, in order, and the throttle callbacks librdkafka made."""
    throttles = []

    def throttled(event):
        throttles.append(event.throttle_time * 1000.0)

    consumer = Consumer({
        "bootstrap.servers": args["bootstrap"],
        "group.id": "throttle-test",
        # Many fetches rather than one: a Kafka quota throttles the fetch after the one over it.
        "max.partition.fetch.bytes": args["fetch_bytes"],
        "enable.auto.commit": False,
        "socket.timeout.ms": 10000,
        "throttle_cb": throttled,
    })
    consumer.assign([TopicPartition(args["topic"], 0, OFFSET_BEGINNING)])
    offsets = []
    errors = []
    started = time.monotonic()
    deadline = started + 60
    while len(offsets) < args["count"] and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            errors.append(msg.error().name())
            continue
        offsets.append(msg.offset())
    elapsed = time.monotonic() - started
    consumer.close()
    return {
        "elapsed_s": elapsed,
        "received": len(offsets),
        "in_order": offsets == list(range(len(offsets))),
        "errors": errors,
        "throttles": len([t for t in throttles if t > 0]),
    }


COMMANDS = {
    "kafka-consume": cmd_kafka_consume,
    "amqp-send": cmd_amqp_send,
    "kafka-produce": cmd_kafka_produce,
}


def main():
    if os.environ.get("INTEROP_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    command, raw = sys.argv[1], sys.argv[2]
    try:
        result = COMMANDS[command](json.loads(raw))
    except Exception:  # noqa: BLE001 - a harness failure
        traceback.print_exc()
        sys.exit(2)
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
