"""Server-side consumer groups through the official oci SDK: the seed 003 scenario, balancing,
commits, heartbeats, GetGroup and UpdateGroup."""

import json
import os
import time
import uuid

import oci

from tributary_oci import (
    client, expect_error, get, group_cursor, offsets, put, raw, run, unb64,
)


def new_stream(partitions, name=None):
    name = name or "g-" + uuid.uuid4().hex[:12]
    r = raw("POST", "/admin/v1/hubs", json.dumps({"name": name, "partitionCount": partitions}))
    assert r.status_code == 201, r.text
    return name


def put_many(c, stream, n, prefix="m"):
    for start in range(0, n, 100):
        result = put(c, stream, [(None, f"{prefix}{i}") for i in range(start, min(n, start + 100))])
        assert result.failures == 0


def reservations(c, stream, group):
    return {r.partition: r for r in c.get_group(stream, group).data.reservations}


def seed_scenario():
    """A reads 100, reads again (committing them) and gets the next 100, processes 15 and falls
    silent past its timeout; B then gets those same next 100 again. Nothing is lost."""
    c = client()
    stream = new_stream(1)
    put_many(c, stream, 300)
    a = group_cursor(c, stream, "seed", "A", timeout_ms=2000)
    first, a = get(c, stream, a, limit=100)
    assert offsets(first) == list(range(0, 100))
    second, a_stale = get(c, stream, a, limit=100)
    assert offsets(second) == list(range(100, 200))
    r = reservations(c, stream, "seed")["0"]
    assert r.committed_offset == 99 and r.reserved_instance == "A" and r.time_reserved_until is not None, r
    processed = second[:15]  # A processes 15 and goes offline.
    assert len(processed) == 15
    b = group_cursor(c, stream, "seed", "B", kind="LATEST", timeout_ms=30000)
    idle, b = get(c, stream, b, limit=100)
    assert idle == [], "B gets nothing while A holds the only partition"
    time.sleep(2.5)
    taken, b = get(c, stream, b, limit=100)
    assert offsets(taken) == list(range(100, 200)), offsets(taken)
    assert [unb64(m.value) for m in taken] == [unb64(m.value) for m in second]
    e = expect_error(409, "Conflict", c.get_messages, stream, a_stale, limit=100)
    assert "removed" in e.message, e.message
    expect_error(409, "Conflict", c.consumer_commit, stream, a_stale)
    rest, b = get(c, stream, b, limit=100)
    assert offsets(rest) == list(range(200, 300))
    r = reservations(c, stream, "seed")["0"]
    assert r.committed_offset == 199 and r.reserved_instance == "B", r


def instances_share_the_partitions():
    c = client()
    stream = new_stream(4)
    put_many(c, stream, 40)
    x = group_cursor(c, stream, "share", "X")
    y = group_cursor(c, stream, "share", "Y")
    held = reservations(c, stream, "share")
    owners = sorted(r.reserved_instance for r in held.values())
    assert owners == ["X", "X", "Y", "Y"], owners
    got = {}
    for name, cur in (("X", x), ("Y", y)):
        messages, _ = get(c, stream, cur)
        for m in messages:
            assert held[m.partition].reserved_instance == name, (name, m.partition)
            got[(m.partition, m.offset)] = name
    assert len(got) == 40, len(got)
    # A third instance joins a group of four partitions: it takes one, and no one else moves more.
    z = group_cursor(c, stream, "share", "Z")
    after = reservations(c, stream, "share")
    moved = [p for p in after if after[p].reserved_instance != held[p].reserved_instance]
    assert len(moved) == 1 and after[moved[0]].reserved_instance == "Z", after
    messages, _ = get(c, stream, z)
    assert {m.partition for m in messages} <= {moved[0]}


def more_instances_than_partitions_get_nothing():
    c = client()
    stream = new_stream(1)
    put_many(c, stream, 5)
    first = group_cursor(c, stream, "over", "first")
    second = group_cursor(c, stream, "over", "second")
    a, _ = get(c, stream, first)
    b, _ = get(c, stream, second)
    assert len(a) == 5 and b == [], (len(a), len(b))


def manual_commit_and_heartbeat():
    c = client()
    stream = new_stream(1)
    put_many(c, stream, 30)
    cur = group_cursor(c, stream, "manual", "only", commit_on_get=False)
    batch, cur = get(c, stream, cur, limit=10)
    batch, cur = get(c, stream, cur, limit=10)
    assert offsets(batch) == list(range(10, 20))
    assert reservations(c, stream, "manual")["0"].committed_offset is None, "nothing committed by gets"
    cur = c.consumer_commit(stream, cur).data.value
    assert reservations(c, stream, "manual")["0"].committed_offset == 19
    cur = c.consumer_heartbeat(stream, cur).data.value
    batch, cur = get(c, stream, cur, limit=10)
    assert offsets(batch) == list(range(20, 30))


def update_group_resets_the_position():
    c = client()
    stream = new_stream(1)
    put_many(c, stream, 10)
    cur = group_cursor(c, stream, "reset", "only")
    batch, cur = get(c, stream, cur)
    batch, cur = get(c, stream, cur)
    assert batch == [] and reservations(c, stream, "reset")["0"].committed_offset == 9
    c.update_group(stream, "reset", oci.streaming.models.UpdateGroupDetails(type="TRIM_HORIZON"))
    assert reservations(c, stream, "reset")["0"].committed_offset is None
    batch, cur = get(c, stream, cur)
    assert offsets(batch) == list(range(10))
    c.update_group(stream, "reset", oci.streaming.models.UpdateGroupDetails(type="LATEST"))
    batch, cur = get(c, stream, cur)
    assert batch == []


def instance_name_is_optional():
    c = client()
    stream = new_stream(1)
    put_many(c, stream, 3)
    cur = group_cursor(c, stream, "anon", None)
    batch, _ = get(c, stream, cur)
    assert len(batch) == 3
    instance = reservations(c, stream, "anon")["0"].reserved_instance
    assert len(instance) == 36, instance  # a generated UUID


def before_restart():
    """Leaves a group with 20 committed of 50 and prints the cursor for after_restart."""
    c = client()
    stream = new_stream(1, os.environ["STREAM"])
    put_many(c, stream, 50)
    cur = group_cursor(c, stream, "durable", "only")
    _, cur = get(c, stream, cur, limit=20)
    _, cur = get(c, stream, cur, limit=20)
    print("CURSOR=" + cur)


def after_restart():
    c = client()
    stream = os.environ["STREAM"]
    assert reservations(c, stream, "durable")["0"].committed_offset == 19
    batch, _ = get(c, stream, os.environ["CURSOR"], limit=100)
    assert offsets(batch) == list(range(20, 50)), offsets(batch)


run({
    "seed_scenario": seed_scenario,
    "instances_share_the_partitions": instances_share_the_partitions,
    "more_instances_than_partitions_get_nothing": more_instances_than_partitions_get_nothing,
    "manual_commit_and_heartbeat": manual_commit_and_heartbeat,
    "update_group_resets_the_position": update_group_resets_the_position,
    "instance_name_is_optional": instance_name_is_optional,
} if os.environ.get("PHASE") is None else {
    "before_restart": before_restart,
    "after_restart": after_restart,
})
