"""Throttling: beyond the configured rates the server answers 429 TooManyRequests and writes
nothing. The Rust test configures 2 GetMessages per second per reader and 2000 bytes per second
per partition."""

import json
import time
import uuid

from tributary_oci import client, cursor, expect_error, get, put, raw, run
import oci


def new_stream():
    name = "t-" + uuid.uuid4().hex[:12]
    r = raw("POST", "/admin/v1/hubs", json.dumps({"name": name, "partitionCount": 1}))
    assert r.status_code == 201, r.text
    return name


def gets_are_throttled():
    c = client()
    stream = new_stream()
    cur = cursor(c, stream, 0, "TRIM_HORIZON")
    _, cur = get(c, stream, cur)
    _, cur = get(c, stream, cur)
    expect_error(429, "TooManyRequests", c.get_messages, stream, cur)
    time.sleep(1.1)
    get(c, stream, cur)


def puts_are_throttled_and_write_nothing():
    c = client()
    stream = new_stream()
    put(c, stream, [(None, "x" * 1500)])
    details = oci.streaming.models.PutMessagesDetails(
        messages=[oci.streaming.models.PutMessagesDetailsEntry(value="eHh4" * 500)])
    expect_error(429, "TooManyRequests", c.put_messages, stream, details)
    time.sleep(1.1)
    messages, _ = get(c, stream, cursor(c, stream, 0, "TRIM_HORIZON"))
    assert len(messages) == 1, len(messages)


run({
    "gets_are_throttled": gets_are_throttled,
    "puts_are_throttled_and_write_nothing": puts_are_throttled_and_write_nothing,
})
