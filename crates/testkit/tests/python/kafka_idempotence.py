"""Drives an idempotent confluent-kafka (librdkafka) producer against Tributary's Kafka door.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust tests (crates/testkit/tests/kafka_produce.rs, crates/cli/tests/kafka_kill.rs) start
the door (and restart or kill it while this runs), run this script and assert on that
document. Exit code 0 means the scenario ran; anything else is a harness failure.

Usage: kafka_idempotence.py <command> <json-arguments>
"""

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_interop import config, run

TIMEOUT_S = 60


def cmd_produce(args):
    """Produces `count` records `r<i>` round-robin over the topic's partitions with
    `enable.idempotence`, `rounds` rounds with `pause_ms` between them (so a test can restart or
    kill the server meanwhile), and waits for every delivery report. Returns the acknowledged
    records (value, partition, offset), the delivery errors, and the producer's fatal errors."""
    conf = config(args)
    conf.update({
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 20,
        "message.timeout.ms": args.get("message_timeout_ms", 120000),
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "retry.backoff.ms": 50,
    })
    acknowledged, errors, fatal = [], [], []

    def on_error(err):
        if err.fatal():
            fatal.append(err.str())

    conf["error_cb"] = on_error
    producer = Producer(conf)
    partitions = args.get("partitions", 3)

    def delivered(err, msg):
        if err:
            errors.append(err.name())
        else:
            acknowledged.append([msg.value().decode(), msg.partition(), msg.offset()])

    count, rounds = args["count"], args.get("rounds", 1)
    per_round = (count + rounds - 1) // rounds
    for i in range(count):
        while True:
            try:
                producer.produce(args["topic"], value=f"r{i}".encode(), partition=i % partitions,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if (i + 1) % per_round == 0:
            producer.poll(0)
            time.sleep(args.get("pause_ms", 0) / 1000)
    left = producer.flush(args.get("flush_s", TIMEOUT_S))
    return {"acknowledged": acknowledged, "delivered": len(acknowledged), "errors": errors,
            "unflushed": left, "fatal": fatal}


def cmd_produce_kafka_python(args):
    """What `produce` does, with kafka-python 3 (idempotence on by default): `count` records
    `r<i>` round-robin over the partitions in `rounds` with `pause_ms` between them. Returns the
    acknowledged records (value, partition, offset) and the errors."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=args["bootstrap"],
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="$ConnectionString",
        sasl_plain_password=args["conn"],
        acks="all",
        linger_ms=5,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
        delivery_timeout_ms=args.get("message_timeout_ms", 120000),
    )
    assert producer.config["enable_idempotence"], "kafka-python 3 is idempotent by default"
    partitions = args.get("partitions", 3)
    acknowledged, errors = [], []
    count, rounds = args["count"], args.get("rounds", 1)
    per_round = (count + rounds - 1) // rounds
    for i in range(count):
        value = f"r{i}"
        future = producer.send(args["topic"], value=value.encode(), partition=i % partitions)
        future.add_callback(
            lambda md, value=value: acknowledged.append([value, md.partition, md.offset]))
        future.add_errback(lambda e: errors.append(type(e).__name__ + ": " + str(e)))
        if (i + 1) % per_round == 0:
            time.sleep(args.get("pause_ms", 0) / 1000)
    producer.flush(timeout=args.get("flush_s", TIMEOUT_S))
    producer.close(timeout=10)
    return {"acknowledged": acknowledged, "delivered": len(acknowledged), "errors": errors,
            "fatal": []}


def cmd_consume(args):
    """Reads every partition of `topic` from the earliest offset until `count` records (or the
    timeout). Returns how many records came, how many distinct values, the header names any
    record had (none are produced, so any is a leak), and with `records` each record as
    (value, partition, offset)."""
    conf = config(args)
    conf.update({"group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer = Consumer(conf)
    partitions = args.get("partitions", 3)
    consumer.assign([TopicPartition(args["topic"], p, -2) for p in range(partitions)])
    values, headers, errors, records = [], set(), [], []
    deadline = time.monotonic() + args.get("timeout", TIMEOUT_S)
    while len(values) < args["count"] and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error():
            errors.append(msg.error().name())
            continue
        values.append(msg.value().decode())
        records.append([values[-1], msg.partition(), msg.offset()])
        for name, _ in msg.headers() or []:
            headers.add(name)
    # Anything beyond `count` (a duplicate) arrives within a few more polls.
    extra_until = time.monotonic() + 1
    while time.monotonic() < extra_until:
        msg = consumer.poll(0.1)
        if msg is not None and not msg.error():
            values.append(msg.value().decode())
            records.append([values[-1], msg.partition(), msg.offset()])
    consumer.close()
    result = {"count": len(values), "distinct": len(set(values)), "headers": sorted(headers),
              "errors": errors}
    if args.get("records"):
        result["records"] = records
    return result


COMMANDS = {
    "produce": cmd_produce,
    "produce_kafka_python": cmd_produce_kafka_python,
    "consume": cmd_consume,
}


if __name__ == "__main__":
    run(COMMANDS)
