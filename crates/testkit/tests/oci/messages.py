"""PutMessages, GetMessages and partition cursors of every type, through the official oci SDK."""

import json
import time
import uuid

import oci

from tributary_oci import (
    b64, client, cursor, expect_error, get, offsets, put, raw, run, unb64,
)


def new_stream(partitions):
    name = "s-" + uuid.uuid4().hex[:12]
    r = raw("POST", "/admin/v1/hubs", json.dumps({"name": name, "partitionCount": partitions}))
    assert r.status_code == 201, r.text
    return name


def read_partition(c, stream, partition):
    messages, _ = get(c, stream, cursor(c, stream, partition, "TRIM_HORIZON"))
    return messages


def put_and_get_round_trip():
    c = client()
    stream = new_stream(4)
    pairs = [(f"key-{i % 5}", f"value-{i}") for i in range(20)] + [(None, f"nokey-{i}") for i in range(4)]
    result = put(c, stream, pairs)
    assert result.failures == 0, result
    assert len(result.entries) == len(pairs)
    by_key = {}
    for (key, value), e in zip(pairs, result.entries):
        assert e.error is None and e.partition is not None and e.offset is not None and e.timestamp is not None, e
        by_key.setdefault(key, []).append((e.partition, e.offset))
    for key, placed in by_key.items():
        if key is None:
            assert len({p for p, _ in placed}) == 4, f"null keys spread round-robin: {placed}"
            continue
        assert len({p for p, _ in placed}) == 1, f"one key, one partition: {placed}"
        assert [o for _, o in placed] == sorted(o for _, o in placed), "order kept per key"
    seen = {}
    for p in range(4):
        for m in read_partition(c, stream, p):
            assert m.stream == stream and m.partition == str(p)
            assert isinstance(m.timestamp.year, int)
            seen[unb64(m.value).decode()] = (None if m.key is None else unb64(m.key).decode(), m.partition, m.offset)
    assert len(seen) == len(pairs), seen
    for (key, value), e in zip(pairs, result.entries):
        assert seen[value] == (key, e.partition, e.offset), (value, seen[value], e)


def every_cursor_type():
    c = client()
    stream = new_stream(1)
    stamps = []
    for i in range(10):
        stamps.append(put(c, stream, [("k", f"m{i}")]).entries[0].timestamp)
        time.sleep(0.005)
    messages, _ = get(c, stream, cursor(c, stream, 0, "TRIM_HORIZON"))
    assert offsets(messages) == list(range(10))
    assert [unb64(m.value).decode() for m in messages] == [f"m{i}" for i in range(10)]
    messages, _ = get(c, stream, cursor(c, stream, 0, "AT_OFFSET", offset=3))
    assert offsets(messages) == list(range(3, 10))
    messages, _ = get(c, stream, cursor(c, stream, 0, "AFTER_OFFSET", offset=3))
    assert offsets(messages) == list(range(4, 10))
    messages, _ = get(c, stream, cursor(c, stream, 0, "AT_TIME", time=stamps[5]))
    assert offsets(messages) == list(range(5, 10)), offsets(messages)
    latest = cursor(c, stream, 0, "LATEST")
    messages, nxt = get(c, stream, latest)
    assert messages == []
    put(c, stream, [("k", "m10"), ("k", "m11")])
    messages, nxt = get(c, stream, nxt)
    assert offsets(messages) == [10, 11]
    messages, nxt = get(c, stream, nxt)
    assert messages == [], "an empty answer still moves on with a cursor"


def limits_and_paging():
    c = client()
    stream = new_stream(1)
    put(c, stream, [(None, f"v{i}") for i in range(25)])
    cur = cursor(c, stream, 0, "TRIM_HORIZON")
    pages = []
    while True:
        messages, cur = get(c, stream, cur, limit=10)
        if not messages:
            break
        pages.append(offsets(messages))
    assert pages == [list(range(0, 10)), list(range(10, 20)), list(range(20, 25))], pages
    expect_error(400, "InvalidParameter", c.get_messages, stream, cur, limit=10001)
    expect_error(400, "InvalidParameter", c.get_messages, stream, cur, limit=0)
    expect_error(400, "InvalidParameter", c.create_cursor, stream,
                 oci.streaming.models.CreateCursorDetails(partition="0", type="AT_OFFSET", offset=26))
    expect_error(400, "InvalidParameter", c.create_cursor, stream,
                 oci.streaming.models.CreateCursorDetails(partition="1", type="TRIM_HORIZON"))


def binary_and_missing_keys():
    c = client()
    stream = new_stream(2)
    key = b"\xff\xfe\x00binary"
    result = put(c, stream, [(key, b"\x00\x01\x02"), (None, b"")])
    assert result.failures == 0
    found = {}
    for p in range(2):
        for m in read_partition(c, stream, p):
            found[unb64(m.value)] = m.key
    assert unb64(found[b"\x00\x01\x02"]) == key
    assert found[b""] is None


def partial_failure_answers_200_with_failures():
    # The server's broker refuses events over 64 KiB; the request limit (1 MiB) lets this through.
    c = client()
    stream = new_stream(1)
    big = "x" * (100 * 1024)
    result = put(c, stream, [("a", "small-1"), ("b", big), ("c", "small-2")])
    assert result.failures == 1, result
    assert result.entries[0].error is None and result.entries[2].error is None
    assert result.entries[1].error and result.entries[1].error_message, result.entries[1]
    assert result.entries[1].offset is None
    values = [unb64(m.value).decode() for m in read_partition(c, stream, 0)]
    assert sorted(values) == ["small-1", "small-2"], values


run({
    "put_and_get_round_trip": put_and_get_round_trip,
    "every_cursor_type": every_cursor_type,
    "limits_and_paging": limits_and_paging,
    "binary_and_missing_keys": binary_and_missing_keys,
    "partial_failure_answers_200_with_failures": partial_failure_answers_200_with_failures,
})
