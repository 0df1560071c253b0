"""Drives confluent-kafka (librdkafka) consumer groups against Tributary's Kafka door.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust tests (crates/testkit/tests/kafka_groups.rs) start the broker and its Kafka door, run this
script and assert on that document. Exit code 0 means the scenario ran (its outcome, success or
an expected error, is in the JSON); anything else is a harness failure.

Usage: kafka_groups.py <command> <json-arguments>
"""

import json
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_interop import config, run

TIMEOUT_S = 60


def consumer_config(args, **more):
    return config(
        args,
        **{
            "group.id": args["group"],
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "client.id": f"consumer-of-{args['group']}",
            "topic.metadata.refresh.interval.ms": 2000,
        },
        **more,
    )


def produce(args, count, start):
    """Produces `count` records to every partition in turn; values `start`…"""
    producer = Producer(config(args, acks="all"))
    partitions = args["partitions"]
    for i in range(count):
        producer.produce(args["topic"], value=str(start + i).encode(), partition=i % partitions)
    left = producer.flush(TIMEOUT_S)
    if left:
        raise RuntimeError(f"{left} records not delivered")


class Member:
    """One consumer of the group on its own thread, recording what it is assigned and reads."""

    def __init__(self, name, args, shared):
        self.name = name
        self.shared = shared
        strategy = args["strategy"]
        self.consumer = Consumer(consumer_config(args, **{"partition.assignment.strategy": strategy}))
        self.assigned = set()
        self.stop = threading.Event()
        self.closed = threading.Event()
        self.consumer.subscribe(
            [args["topic"]],
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_lost=self.on_revoke,
        )
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def on_assign(self, consumer, partitions):
        with self.shared["lock"]:
            for tp in partitions:
                owner = self.shared["owner"].get(tp.partition)
                if owner is not None and owner != self.name:
                    self.shared["violations"].append(
                        f"{self.name} assigned partition {tp.partition} while {owner} holds it")
                self.shared["owner"][tp.partition] = self.name
                self.assigned.add(tp.partition)
        if self.shared["cooperative"]:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    def on_revoke(self, consumer, partitions):
        try:
            consumer.commit(asynchronous=False)
        except KafkaException:
            pass  # nothing consumed since the last commit
        with self.shared["lock"]:
            for tp in partitions:
                if self.shared["owner"].get(tp.partition) == self.name:
                    self.shared["owner"][tp.partition] = None
                self.assigned.discard(tp.partition)
        if self.shared["cooperative"]:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def run(self):
        while not self.stop.is_set():
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                with self.shared["lock"]:
                    self.shared["errors"].append(f"{self.name}: {msg.error().name()}")
                continue
            key = (msg.partition(), msg.offset())
            with self.shared["lock"]:
                owner = self.shared["owner"].get(msg.partition())
                if owner != self.name:
                    self.shared["violations"].append(
                        f"{self.name} read {key} while {owner} holds the partition")
                if key in self.shared["read"]:
                    self.shared["violations"].append(
                        f"{key} read by {self.shared['read'][key]} and {self.name}")
                self.shared["read"][key] = self.name
        self.consumer.close()
        self.closed.set()


def wait_until(what, predicate, timeout=TIMEOUT_S):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting until {what}")


def cmd_rebalance(args):
    """Three members share the topic; a fourth joins; the first leaves. Between steps, records
    are produced and every one must be read once, by the member holding its partition."""
    shared = {"lock": threading.Lock(), "owner": {}, "read": {}, "violations": [], "errors": [],
              "cooperative": args["strategy"] == "cooperative-sticky"}
    partitions = args["partitions"]
    members = []
    phases = []
    produced = 0

    def settled(count):
        with shared["lock"]:
            live = [m for m in members if not m.stop.is_set()]
            sets = [m.assigned for m in live]
            covered = set().union(*sets) if sets else set()
            return (len(live) == count and all(sets)
                    and covered == set(range(partitions))
                    and sum(len(s) for s in sets) == partitions)

    def phase(count, records):
        nonlocal produced
        wait_until(f"{count} members share the partitions", lambda: settled(count))
        produce(args, records, produced)
        produced += records
        wait_until(f"all {produced} records are read", lambda: len(shared["read"]) >= produced)
        with shared["lock"]:
            phases.append({m.name: sorted(m.assigned) for m in members if not m.stop.is_set()})

    for name in ["a", "b", "c"]:
        members.append(Member(name, args, shared))
    phase(3, args["records"])
    members.append(Member("d", args, shared))
    phase(4, args["records"])
    members[0].stop.set()
    members[0].closed.wait(TIMEOUT_S)
    phase(3, args["records"])
    for m in members:
        m.stop.set()
    for m in members:
        m.closed.wait(TIMEOUT_S)
    return {"phases": phases, "read": len(shared["read"]), "produced": produced,
            "violations": shared["violations"], "errors": shared["errors"]}


def cmd_consume_and_commit(args):
    """Reads `expect` records as a member of the group, commits them synchronously, and returns
    the offsets read and the committed offsets the door reports."""
    consumer = Consumer(consumer_config(args, **{"enable.auto.commit": False}))
    consumer.subscribe([args["topic"]])
    read = []
    deadline = time.time() + TIMEOUT_S
    while len(read) < args["expect"] and time.time() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        read.append([msg.partition(), msg.offset(), msg.value().decode()])
    # Anything more within a moment would be past what was produced.
    end = time.time() + args.get("linger_s", 0)
    while time.time() < end:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            read.append([msg.partition(), msg.offset(), msg.value().decode()])
    if read:
        consumer.commit(asynchronous=False)
    tps = [TopicPartition(args["topic"], p) for p in range(args["partitions"])]
    committed = consumer.committed(tps, timeout=10)
    consumer.close()
    return {"read": sorted(read), "committed": {str(tp.partition): tp.offset for tp in committed}}


def cmd_committed(args):
    """The committed offsets of `group` for every partition (−1001, OFFSET_INVALID, for none),
    asked without joining the group."""
    consumer = Consumer(consumer_config(args))
    tps = [TopicPartition(args["topic"], p) for p in range(args["partitions"])]
    committed = consumer.committed(tps, timeout=10)
    consumer.close()
    return {"committed": {str(tp.partition): tp.offset for tp in committed},
            "errors": [tp.error.name() for tp in committed if tp.error]}


def cmd_hold(args):
    """Joins the group and prints {"joined": [...]} once it has partitions, then
    {"assigned": [...]} whenever its assignment changes after that; leaves at a line on stdin."""
    consumer = Consumer(consumer_config(args))
    assigned = []
    changed = threading.Event()

    def on_assign(c, partitions):
        assigned[:] = sorted(tp.partition for tp in partitions)
        changed.set()

    consumer.subscribe([args["topic"]], on_assign=on_assign)
    deadline = time.time() + TIMEOUT_S
    while not assigned and time.time() < deadline:
        consumer.poll(0.1)
    print(json.dumps({"joined": assigned}), flush=True)
    changed.clear()
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
    while not done.is_set():
        consumer.poll(0.1)
        if changed.is_set():
            changed.clear()
            print(json.dumps({"assigned": assigned}), flush=True)
    consumer.close()
    return {"left": True}


def cmd_ride(args):
    """Reads as a member of the group, committing each record synchronously and printing
    {"committed": [partition, offset]} once its commit succeeded (a commit that fails, as while
    the door restarts, is retried until it does); stops at a line on stdin."""
    consumer = Consumer(consumer_config(args, **{"enable.auto.commit": False}))
    consumer.subscribe([args["topic"]])
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
    while not done.is_set():
        msg = consumer.poll(0.1)
        if msg is None or msg.error():
            continue
        while not done.is_set():
            try:
                consumer.commit(message=msg, asynchronous=False)
                break
            except KafkaException:
                time.sleep(0.2)
        print(json.dumps({"committed": [msg.partition(), msg.offset()]}), flush=True)
    consumer.close()
    return {"stopped": True}


def cmd_admin(args):
    """Lists, describes and deletes groups with the AdminClient while `member` holds one."""
    admin = AdminClient(config(args))
    listed = admin.list_consumer_groups(request_timeout=10).result()
    groups = sorted(g.group_id for g in listed.valid)
    states = {g.group_id: str(g.state) for g in listed.valid}
    described = {}
    for group, future in admin.describe_consumer_groups(args["describe"], request_timeout=10).items():
        try:
            d = future.result()
            described[group] = {
                "state": str(d.state),
                "assignor": d.partition_assignor,
                "members": sorted(
                    sorted(tp.partition for tp in m.assignment.topic_partitions) for m in d.members),
                "clients": sorted(m.client_id for m in d.members),
            }
        except KafkaException as e:
            described[group] = {"error": e.args[0].name()}
    deleted = {}
    for group, future in admin.delete_consumer_groups(args["delete"], request_timeout=10).items():
        try:
            future.result()
            deleted[group] = None
        except KafkaException as e:
            deleted[group] = e.args[0].name()
    return {"groups": groups, "states": states, "described": described, "deleted": deleted}


def cmd_refused(args):
    """A login without Listen: subscribing reports the consumer error, committing the
    partition's error."""
    consumer = Consumer(consumer_config(args))
    consumer.subscribe([args["topic"]])
    errors = []
    deadline = time.time() + 20
    while not errors and time.time() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error():
            errors.append(msg.error().name())
    commit_error = None
    try:
        result = consumer.commit(offsets=[TopicPartition(args["topic"], 0, 1)], asynchronous=False)
        commit_error = next((tp.error.name() for tp in result or [] if tp.error), None)
    except KafkaException as e:
        commit_error = e.args[0].name()
    consumer.close()
    return {"errors": errors, "commit_error": commit_error}


def cmd_commit(args):
    """Commits `offsets` ([topic, partition, offset] each) for `group` without joining it and
    returns each partition's error (None when committed), then what OffsetFetch answers for
    them."""
    consumer = Consumer(consumer_config(args))
    tps = [TopicPartition(t, p, o) for t, p, o in args["offsets"]]
    try:
        result = consumer.commit(offsets=tps, asynchronous=False)
        errors = [tp.error.name() if tp.error else None for tp in result]
    except KafkaException as e:
        errors = [e.args[0].name()]
    fetched = consumer.committed([TopicPartition(t, p) for t, p, _ in args["offsets"]], timeout=10)
    consumer.close()
    return {"errors": errors,
            "fetched": [[tp.offset, tp.error.name() if tp.error else None] for tp in fetched]}


COMMANDS = {
    "rebalance": cmd_rebalance,
    "consume_and_commit": cmd_consume_and_commit,
    "committed": cmd_committed,
    "hold": cmd_hold,
    "ride": cmd_ride,
    "admin": cmd_admin,
    "refused": cmd_refused,
    "commit": cmd_commit,
}


if __name__ == "__main__":
    run(COMMANDS)
