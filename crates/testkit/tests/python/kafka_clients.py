"""Drives kafka-python (2.x or 3.x, whichever `import kafka` finds) or aiokafka against
Tributary's Kafka door, configured as for Event Hubs' Kafka endpoint: SASL_PLAINTEXT, PLAIN,
user `$ConnectionString`, a connection string (or a SAS token) as the password.

One run does every check for one client and prints one JSON document (the last line of
stdout); crates/testkit/tests/kafka_clients.rs starts the door, runs this once per client and
asserts on the document. A check that fails records its error in the document (the test
asserts on it); exit code 0 means the run completed, anything else is a harness failure.

Usage: kafka_clients.py kafka-python|aiokafka <json-arguments>
  arguments: bootstrap, conns {root, token, listen, send, bad}, topic (3 partitions), time_topic
  (1 partition), compressions, group (a consumer group id), admin_topic (a topic to create and
  delete; kafka-python only).
"""

import asyncio
import logging
import time

from kafka_interop import run

TIMEOUT_S = 30
# Every record's CreateTime is this plus its index, so the consumer can check it came back.
BASE_TIMESTAMP = 1_700_000_000_000
# Over the 1 MiB a record may hold (the door's limit, as Azure's); the clients' own request
# limit is raised above it so the door, not the client, refuses it.
OVERSIZE = 1024 * 1024 + 1
CLIENT_REQUEST_MAX = 4 * 1024 * 1024


def planned(compressions):
    """The records the produce check sends: for each acks setting and compression, two
    records to one partition (acks 0 to 0, 1 to 1, all to 2); the second has no key."""
    plan = []
    for acks, partition in (("0", 0), ("1", 1), ("all", 2)):
        for compression in compressions:
            for i in range(2):
                n = len(plan)
                plan.append({
                    "acks": acks,
                    "compression": compression,
                    "partition": partition,
                    "value": f"{acks}-{compression}-{i}",
                    "key": f"key-{n}" if i == 0 else None,
                    "headers": {"trace": "00ff10", "n": str(n).encode().hex()},
                    "timestamp": BASE_TIMESTAMP + n,
                })
    return plan


def acks_value(acks):
    return -1 if acks == "all" else int(acks)


def error_text(e):
    return f"{type(e).__name__}: {e}"


def record_json(msg):
    """A consumed record as the test compares it (kafka-python and aiokafka share the shape)."""
    return {
        "partition": msg.partition,
        "offset": msg.offset,
        "value": msg.value.decode() if msg.value is not None else None,
        "key": msg.key.decode() if msg.key is not None else None,
        "headers": {k: (v.hex() if v is not None else None) for k, v in (msg.headers or [])},
        "timestamp": msg.timestamp,
    }


def sasl(password):
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "$ConnectionString",
        "sasl_plain_password": password,
    }


class AuthLog(logging.Handler):
    """Keeps the clients' log lines about a failed SASL login: where a client retries a refused
    login until its timeout (kafka-python does, as against any Kafka broker), the door's
    refusal reaches the user only in its log."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        line = record.getMessage()
        if "Authentication" in line and len(self.lines) < 3:
            self.lines.append(line)


AUTH_LOG = AuthLog()
for name in ("kafka", "aiokafka"):
    logging.getLogger(name).addHandler(AUTH_LOG)
    logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger(name).propagate = False


def timed(check):
    """Runs `check`, returning what it returned or its error, and how long it took (a refusal
    must come quickly, not after a hang)."""
    started = time.monotonic()
    try:
        outcome = {"result": check(), "error": None}
    except Exception as e:  # noqa: BLE001 - the error is the outcome the test asserts on
        outcome = {"result": None, "error": error_text(e)}
    outcome["seconds"] = round(time.monotonic() - started, 2)
    return outcome


# ---------------------------------------------------------------- kafka-python (2.x and 3.x)

def kp_producer(args, password, **extra):
    from kafka import KafkaProducer
    conf = dict(sasl(password), bootstrap_servers=args["bootstrap"], request_timeout_ms=10_000,
                max_block_ms=10_000, max_request_size=CLIENT_REQUEST_MAX)
    conf.update(extra)
    return KafkaProducer(**conf)


def kp_consumer(args, password, **extra):
    from kafka import KafkaConsumer
    conf = dict(sasl(password), bootstrap_servers=args["bootstrap"], enable_auto_commit=False,
                request_timeout_ms=15_000, fetch_max_wait_ms=100, consumer_timeout_ms=1000)
    conf.update(extra)
    return KafkaConsumer(**conf)


def kp_send(producer, topic, record):
    headers = [(k, bytes.fromhex(v)) for k, v in record.get("headers", {}).items()]
    key = record["key"].encode() if record.get("key") is not None else None
    return producer.send(topic, value=record["value"].encode(), key=key, headers=headers,
                         partition=record.get("partition"), timestamp_ms=record.get("timestamp"))


def kp_push_acks_0(producer):
    """Works around a kafka-python 2.x bug (2.3.3): its client marks a connection as having
    bytes to send only when the request's future is not done yet, and an acks 0 request's
    future is done at once, so the request waits for the next one on that connection (and is
    lost when the producer closes first). Writes what the connections hold; 3.x needs none."""
    import kafka
    if kafka.__version__.startswith("2."):
        for conn in list(producer._sender._client._conns.values()):
            conn.send_pending_requests()


def kp_produce_plan(args, plan):
    """Sends the plan, one producer per acks setting and compression; returns each record's
    offset (None with acks 0, which has no answer) or its error."""
    results = []
    groups = {}
    for record in plan:
        groups.setdefault((record["acks"], record["compression"]), []).append(record)
    for (acks, compression), records in groups.items():
        idempotent = acks == "all"
        producer = kp_producer(args, args["conns"]["root"], acks=acks_value(acks),
                               compression_type=None if compression == "none" else compression,
                               enable_idempotence=idempotent)
        futures = [kp_send(producer, args["topic"], r) for r in records]
        producer.flush(TIMEOUT_S)
        if acks == "0":
            kp_push_acks_0(producer)
        for future in futures:
            try:
                meta = future.get(TIMEOUT_S)
                results.append({"offset": meta.offset if acks != "0" else None, "error": None})
            except Exception as e:  # noqa: BLE001
                results.append({"offset": None, "error": error_text(e)})
        producer.close(5)
    return results


def kp_read(consumer, count):
    """Polls until `count` records came or nothing more comes within the timeout."""
    records = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(record_json(m) for m in batch)
    return records


def kp_consume_all(args, count):
    """Assigns the topic's three partitions from the beginning (logged in with a SAS token)."""
    from kafka import TopicPartition
    consumer = kp_consumer(args, args["conns"]["token"])
    partitions = [TopicPartition(args["topic"], p) for p in range(3)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records = kp_read(consumer, count)
    ends = {str(tp.partition): o for tp, o in consumer.end_offsets(partitions).items()}
    consumer.close()
    return {"records": records, "end_offsets": ends}


def kp_by_time(args):
    """Produces two records, notes a time between them, and finds the second by that time
    (offsets_for_times), then seeks there and reads it."""
    from kafka import TopicPartition
    producer = kp_producer(args, args["conns"]["root"], acks=-1)
    topic = args["time_topic"]
    kp_send(producer, topic, {"value": "before", "partition": 0}).get(TIMEOUT_S)
    time.sleep(0.05)
    between = int(time.time() * 1000)
    time.sleep(0.05)
    kp_send(producer, topic, {"value": "after", "partition": 0}).get(TIMEOUT_S)
    producer.close(5)
    consumer = kp_consumer(args, args["conns"]["root"])
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    found = consumer.offsets_for_times({tp: between})[tp]
    later = consumer.offsets_for_times({tp: int(time.time() * 1000) + 60_000})[tp]
    consumer.seek(tp, found.offset)
    read = kp_read(consumer, 1)
    consumer.close()
    return {"offset": found.offset, "timestamp": found.timestamp, "after_the_end": later,
            "read": read[:1]}


def kp_refused_produce(args, password, record):
    producer = kp_producer(args, password, acks=-1, retries=0)
    try:
        kp_send(producer, args["topic"], record).get(TIMEOUT_S)
    finally:
        producer.close(5)


def kp_refused_fetch(args, password):
    from kafka import TopicPartition
    consumer = kp_consumer(args, password)
    try:
        tp = TopicPartition(args["topic"], 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if consumer.poll(timeout_ms=200):
                return "records were fetched"
        return "no error within the timeout"
    finally:
        consumer.close()


def kp_bad_login(args):
    """A produce with a wrong key. kafka-python retries a refused login (the door answers
    SASL_AUTHENTICATION_FAILED and closes, as Kafka does) until a timeout: 3.x's bootstrap
    timeout, 2.x's max_block_ms; the door's reason is in its log (AUTH_LOG)."""
    import kafka
    extra = {"max_block_ms": 5_000}
    if not kafka.__version__.startswith("2."):
        extra["bootstrap_timeout_ms"] = 5_000
    producer = kp_producer(args, args["conns"]["bad"], **extra)
    try:
        kp_send(producer, args["topic"], {"value": "refused", "partition": 0}).get(TIMEOUT_S)
    finally:
        producer.close(0)


def kp_group(args, count):
    """Subscribes in group `group`, reads every record, commits, and reads the commits back."""
    from kafka import TopicPartition
    consumer = kp_consumer(args, args["conns"]["root"], group_id=args["group"],
                           auto_offset_reset="earliest")
    consumer.subscribe([args["topic"]])
    try:
        records = kp_read(consumer, count)
        assigned = sorted(tp.partition for tp in consumer.assignment())
        consumer.commit()
        partitions = [TopicPartition(args["topic"], p) for p in range(3)]
        committed = {str(tp.partition): consumer.committed(tp) for tp in partitions}
    finally:
        consumer.close()
    return {"records": records, "assigned": assigned, "committed": committed}


def kp_admin(args):
    """Creates topic `admin_topic` with two partitions, finds it, deletes it; and is refused
    the creation without Manage."""
    from kafka.admin import KafkaAdminClient, NewTopic
    name = args["admin_topic"]

    def admin_client(password):
        return KafkaAdminClient(**sasl(password), bootstrap_servers=args["bootstrap"],
                                request_timeout_ms=10_000)

    admin = admin_client(args["conns"]["root"])
    try:
        admin.create_topics([NewTopic(name=name, num_partitions=2, replication_factor=1)])
        listed = name in admin.list_topics()
        described = admin.describe_topics([name])
        partitions = len(described[0]["partitions"])
        admin.delete_topics([name])
        deleted = name not in admin.list_topics()
    finally:
        admin.close()
    refused = timed(lambda: kp_admin_refused(admin_client(args["conns"]["send"]), name))
    return {"listed": listed, "partitions": partitions, "deleted": deleted, "refused": refused}


def kp_admin_refused(admin, name):
    from kafka.admin import NewTopic
    try:
        return str(admin.create_topics([NewTopic(name=name, num_partitions=1,
                                                 replication_factor=1)]))
    finally:
        admin.close()


def kafka_python(args):
    import kafka
    plan = planned(args["compressions"])
    out = {"client": f"kafka-python {kafka.__version__}", "plan": plan}
    out["produced"] = timed(lambda: kp_produce_plan(args, plan))
    out["by_time"] = timed(lambda: kp_by_time(args))
    big = {"value": "x" * OVERSIZE, "partition": 0}
    out["oversize"] = timed(lambda: kp_refused_produce(args, args["conns"]["root"], big))
    small = {"value": "refused", "partition": 0}
    out["no_send_right"] = timed(lambda: kp_refused_produce(args, args["conns"]["listen"], small))
    out["no_listen_right"] = timed(lambda: kp_refused_fetch(args, args["conns"]["send"]))
    out["bad_credentials"] = timed(lambda: kp_bad_login(args))
    out["auth_log"] = AUTH_LOG.lines
    out["consumed"] = timed(lambda: kp_consume_all(args, len(plan)))
    out["group"] = timed(lambda: kp_group(args, len(plan)))
    out["admin"] = timed(lambda: kp_admin(args))
    return out


# ---------------------------------------------------------------- aiokafka

def aio_conf(args, password):
    return dict(sasl(password), bootstrap_servers=args["bootstrap"], request_timeout_ms=10_000)


async def aio_send(producer, topic, record):
    headers = [(k, bytes.fromhex(v)) for k, v in record.get("headers", {}).items()]
    key = record["key"].encode() if record.get("key") is not None else None
    return await producer.send(topic, value=record["value"].encode(), key=key, headers=headers,
                               partition=record.get("partition"),
                               timestamp_ms=record.get("timestamp"))


async def aio_produce_plan(args, plan):
    from aiokafka import AIOKafkaProducer
    results = []
    groups = {}
    for record in plan:
        groups.setdefault((record["acks"], record["compression"]), []).append(record)
    for (acks, compression), records in groups.items():
        producer = AIOKafkaProducer(
            **aio_conf(args, args["conns"]["root"]), acks=acks_value(acks),
            compression_type=None if compression == "none" else compression,
            enable_idempotence=acks == "all", max_request_size=CLIENT_REQUEST_MAX)
        await producer.start()
        try:
            futures = [await aio_send(producer, args["topic"], r) for r in records]
            for future in futures:
                try:
                    meta = await asyncio.wait_for(future, TIMEOUT_S)
                    offset = meta.offset if acks != "0" else None
                    results.append({"offset": offset, "error": None})
                except Exception as e:  # noqa: BLE001
                    results.append({"offset": None, "error": error_text(e)})
        finally:
            await producer.stop()
    return results


async def aio_read(consumer, count):
    records = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(records) < count and time.monotonic() < deadline:
        for batch in (await consumer.getmany(timeout_ms=200)).values():
            records.extend(record_json(m) for m in batch)
    return records


def aio_consumer(args, password):
    from aiokafka import AIOKafkaConsumer
    return AIOKafkaConsumer(**aio_conf(args, password), enable_auto_commit=False,
                            fetch_max_wait_ms=100)


async def aio_consume_all(args, count):
    from aiokafka import TopicPartition
    consumer = aio_consumer(args, args["conns"]["token"])
    await consumer.start()
    try:
        partitions = [TopicPartition(args["topic"], p) for p in range(3)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records = await aio_read(consumer, count)
        ends = await consumer.end_offsets(partitions)
        return {"records": records, "end_offsets": {str(tp.partition): o for tp, o in ends.items()}}
    finally:
        await consumer.stop()


async def aio_by_time(args):
    from aiokafka import AIOKafkaProducer, TopicPartition
    topic = args["time_topic"]
    producer = AIOKafkaProducer(**aio_conf(args, args["conns"]["root"]), acks=-1)
    await producer.start()
    try:
        await (await aio_send(producer, topic, {"value": "before", "partition": 0}))
        await asyncio.sleep(0.05)
        between = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        await (await aio_send(producer, topic, {"value": "after", "partition": 0}))
    finally:
        await producer.stop()
    consumer = aio_consumer(args, args["conns"]["root"])
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        found = (await consumer.offsets_for_times({tp: between}))[tp]
        later = (await consumer.offsets_for_times({tp: int(time.time() * 1000) + 60_000}))[tp]
        consumer.seek(tp, found.offset)
        read = await aio_read(consumer, 1)
        return {"offset": found.offset, "timestamp": found.timestamp, "after_the_end": later,
                "read": read[:1]}
    finally:
        await consumer.stop()


async def aio_refused_produce(args, password, record):
    from aiokafka import AIOKafkaProducer
    producer = AIOKafkaProducer(**aio_conf(args, password), acks=-1,
                                max_request_size=CLIENT_REQUEST_MAX)
    await producer.start()
    try:
        await asyncio.wait_for(await aio_send(producer, args["topic"], record), TIMEOUT_S)
    finally:
        await producer.stop()


async def aio_refused_fetch(args, password):
    from aiokafka import TopicPartition
    consumer = aio_consumer(args, password)
    await consumer.start()
    try:
        tp = TopicPartition(args["topic"], 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if await consumer.getmany(timeout_ms=200):
                return "records were fetched"
        return "no error within the timeout"
    finally:
        await consumer.stop()


async def aio_bad_login(args):
    consumer = aio_consumer(args, args["conns"]["bad"])
    try:
        await consumer.start()
        return sorted(await consumer.topics())
    finally:
        await consumer.stop()


async def aio_group(args, count):
    """Subscribes in group `group`, reads every record, commits, and reads the commits back."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    consumer = AIOKafkaConsumer(args["topic"], **aio_conf(args, args["conns"]["root"]),
                                group_id=args["group"], auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=100)
    await consumer.start()
    try:
        records = await aio_read(consumer, count)
        assigned = sorted(tp.partition for tp in consumer.assignment())
        await consumer.commit()
        committed = {str(p): await consumer.committed(TopicPartition(args["topic"], p))
                     for p in range(3)}
    finally:
        await consumer.stop()
    return {"records": records, "assigned": assigned, "committed": committed}


async def atimed(check):
    started = time.monotonic()
    try:
        outcome = {"result": await asyncio.wait_for(check, 2 * TIMEOUT_S), "error": None}
    except Exception as e:  # noqa: BLE001 - the error is the outcome the test asserts on
        outcome = {"result": None, "error": error_text(e)}
    outcome["seconds"] = round(time.monotonic() - started, 2)
    return outcome


async def aiokafka_checks(args):
    import aiokafka
    plan = planned(args["compressions"])
    out = {"client": f"aiokafka {aiokafka.__version__}", "plan": plan}
    out["produced"] = await atimed(aio_produce_plan(args, plan))
    out["by_time"] = await atimed(aio_by_time(args))
    big = {"value": "x" * OVERSIZE, "partition": 0}
    out["oversize"] = await atimed(aio_refused_produce(args, args["conns"]["root"], big))
    small = {"value": "refused", "partition": 0}
    out["no_send_right"] = await atimed(aio_refused_produce(args, args["conns"]["listen"], small))
    out["no_listen_right"] = await atimed(aio_refused_fetch(args, args["conns"]["send"]))
    out["bad_credentials"] = await atimed(aio_bad_login(args))
    out["auth_log"] = AUTH_LOG.lines
    out["consumed"] = await atimed(aio_consume_all(args, len(plan)))
    out["group"] = await atimed(aio_group(args, len(plan)))
    return out


CLIENTS = {
    "kafka-python": kafka_python,
    "aiokafka": lambda args: asyncio.run(aiokafka_checks(args)),
}


if __name__ == "__main__":
    run(CLIENTS)
