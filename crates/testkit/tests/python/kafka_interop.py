"""Drives confluent-kafka (librdkafka) against Tributary's Kafka door.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust tests (crates/testkit/tests/kafka.rs) start the hub and its Kafka door, run this script
and assert on that document. Exit code 0 means the scenario ran (its outcome, success or an
expected error, is in the JSON); anything else is a harness failure.

Usage: kafka_interop.py <command> <json-arguments>
"""

import json
import sys
import time
import traceback

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

TIMEOUT_S = 30


def config(args, **more):
    """The client configuration: SASL PLAIN with `$ConnectionString` and the connection string
    as the password, as for Event Hubs (plain TCP: SASL_PLAINTEXT); then `more`, then the
    test's `extra` settings. Every Kafka script of these tests uses it."""
    conf = {
        "bootstrap.servers": args["bootstrap"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "$ConnectionString",
        "sasl.password": args["conn"],
        "socket.timeout.ms": 10000,
    }
    conf.update(more)
    conf.update(args.get("extra", {}))
    return conf


def cmd_produce(args):
    """Produces `records` ({value (null: a tombstone), key?, headers?: {name: hex},
    partition?, timestamp?}) with `acks`; returns each delivery report in order."""
    conf = config(args)
    conf["acks"] = str(args["acks"])
    producer = Producer(conf)
    reports = []

    def delivered(err, msg):
        reports.append({
            "error": err.name() if err else None,
            "partition": msg.partition(),
            "offset": msg.offset(),
        })

    for record in args["records"]:
        value = record["value"].encode() if record["value"] is not None else None
        kwargs = {"value": value, "on_delivery": delivered}
        if "key" in record:
            kwargs["key"] = record["key"].encode()
        if "headers" in record:
            kwargs["headers"] = [(k, bytes.fromhex(v)) for k, v in record["headers"].items()]
        if "partition" in record:
            kwargs["partition"] = record["partition"]
        if "timestamp" in record:
            kwargs["timestamp"] = record["timestamp"]
        producer.produce(args["topic"], **kwargs)
    left = producer.flush(TIMEOUT_S)
    return {"reports": reports, "unflushed": left}


def describe(msg):
    timestamp_type, timestamp = msg.timestamp()
    return {
        "partition": msg.partition(),
        "offset": msg.offset(),
        "key": msg.key().decode() if msg.key() is not None else None,
        "value": msg.value().decode() if msg.value() is not None else None,
        "headers": {k: (v.hex() if v is not None else None) for k, v in (msg.headers() or [])},
        "timestamp": timestamp,
        "timestamp_type": timestamp_type,
    }


def cmd_consume(args):
    """Assigns `partitions` of `topic` from offset `offset` (default -2, the earliest; no
    group) and reads until `count` records or the timeout; also reports each partition's
    watermarks."""
    conf = config(args)
    conf.update({"group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer = Consumer(conf)
    start = args.get("offset", -2)
    partitions = [TopicPartition(args["topic"], p, start) for p in args["partitions"]]
    consumer.assign(partitions)
    records, errors = [], []
    deadline_polls = args.get("timeout", TIMEOUT_S) * 10
    while len(records) < args["count"] and deadline_polls > 0:
        deadline_polls -= 1
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error():
            errors.append(msg.error().name())
            continue
        records.append(describe(msg))
    watermarks = {
        str(p): list(consumer.get_watermark_offsets(TopicPartition(args["topic"], p), timeout=10))
        for p in args["partitions"]
    }
    times = {}
    if "time" in args:
        asked = [TopicPartition(args["topic"], p, args["time"]) for p in args["partitions"]]
        for tp in consumer.offsets_for_times(asked, timeout=10):
            times[str(tp.partition)] = tp.offset
    consumer.close()
    return {"records": records, "errors": errors, "watermarks": watermarks, "times": times}


def cmd_metadata(args):
    """Lists `topic` (or every topic when none): each topic's error name and partition count;
    or the error that stopped the listing (bad credentials)."""
    producer = Producer(config(args))
    try:
        if "topic" in args:
            meta = producer.list_topics(args["topic"], timeout=args.get("timeout", 10))
        else:
            meta = producer.list_topics(timeout=args.get("timeout", 10))
    except KafkaException as e:
        return {"error": e.args[0].name(), "message": e.args[0].str()}
    topics = {
        name: {"error": t.error.name() if t.error else None, "partitions": len(t.partitions)}
        for name, t in meta.topics.items()
    }
    brokers = [f"{b.host}:{b.port}" for b in meta.brokers.values()]
    return {"topics": topics, "brokers": brokers}


def cmd_wake(args):
    """Long-polls partition `partition` of `topic` from its end with `fetch.wait.max.ms` at
    `wait_ms`, produces one record after the fetch is waiting, and reports how long the record
    took to arrive: far below `wait_ms` only if the append woke the fetch."""
    conf = config(args)
    conf.update({
        "group.id": "unused",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": args["wait_ms"],
        "fetch.min.bytes": 1,
    })
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(args["topic"], args["partition"], -1)])
    # Let the consumer resolve the end offset and start its long poll.
    started = time.monotonic()
    while time.monotonic() - started < 2:
        consumer.poll(0.1)
    producer_conf = config(args)
    producer_conf["acks"] = "all"
    producer = Producer(producer_conf)
    producer.produce(args["topic"], value=b"wake", partition=args["partition"])
    producer.flush(TIMEOUT_S)
    sent = time.monotonic()
    got = None
    while time.monotonic() - sent < TIMEOUT_S:
        msg = consumer.poll(0.05)
        if msg is not None and not msg.error():
            got = {"value": msg.value().decode(), "seconds": time.monotonic() - sent}
            break
    consumer.close()
    return {"received": got}


def cmd_transactional(args):
    """A transactional producer's init_transactions(): the error it raises (name, whether
    retriable or fatal) and how long it took; it must raise, not hang."""
    conf = config(args)
    conf["transactional.id"] = "tx-1"
    producer = Producer(conf)
    started = time.monotonic()
    try:
        producer.init_transactions(args.get("timeout", 20))
        outcome = {"error": None}
    except KafkaException as e:
        err = e.args[0]
        outcome = {"error": err.name(), "message": err.str(), "fatal": err.fatal(),
                   "retriable": err.retriable()}
    outcome["seconds"] = time.monotonic() - started
    return outcome


COMMANDS = {
    "transactional": cmd_transactional,
    "wake": cmd_wake,
    "produce": cmd_produce,
    "consume": cmd_consume,
    "metadata": cmd_metadata,
}


def run(commands):
    """Runs the command named by argv[1] with the JSON arguments of argv[2] and prints its
    result as JSON; a harness failure exits 2 with its traceback. Every Kafka script of these
    tests ends with it."""
    command, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    try:
        result = commands[command](args)
    except Exception:  # noqa: BLE001 - the harness shows it
        traceback.print_exc()
        sys.exit(2)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run(COMMANDS)
