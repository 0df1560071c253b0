"""Every refused request gets its documented status and OCI error code, echoes opc-request-id,
and writes nothing: bad JSON, bad base64, unknown streams, expired and forged cursors, oversize
messages, bad signatures, limits."""

import json
import os
import uuid

import oci
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tributary_oci import (
    b64, client, cursor, expect_error, expect_raw_error, get, group_cursor, put, raw, run, url,
)


def new_stream(partitions=1):
    name = "e-" + uuid.uuid4().hex[:12]
    r = raw("POST", "/admin/v1/hubs", json.dumps({"name": name, "partitionCount": partitions}))
    assert r.status_code == 201, r.text
    return name


def assert_empty(stream, partitions=1):
    c = client()
    for p in range(partitions):
        messages, _ = get(c, stream, cursor(c, stream, p, "TRIM_HORIZON"))
        assert messages == [], f"nothing may be written, found {len(messages)} in partition {p}"


def bad_json():
    stream = new_stream()
    path = f"/20180418/streams/{stream}/messages"
    expect_raw_error(raw("POST", path, "{not json"), 400, "CannotParseRequest")
    expect_raw_error(raw("POST", path, '{"messages": [{"value": "aGk="}]'), 400, "CannotParseRequest")
    expect_raw_error(raw("POST", path, '{"messages": [{"value": "aGk=", "color": "red"}]}'), 400, "InvalidParameter")
    expect_raw_error(raw("POST", path, '{"messages": [{"key": "aGk="}]}'), 400, "MissingParameter")
    expect_raw_error(raw("POST", path, '{"messages": []}'), 400, "InvalidParameter")
    expect_raw_error(raw("POST", path, '{"messages": [{"value": 7}]}'), 400, "InvalidParameter")
    expect_raw_error(raw("POST", f"/20180418/streams/{stream}/cursors", '{"partition": "0", "type": "SOMETIMES"}'), 400, "InvalidParameter")
    expect_raw_error(raw("POST", f"/20180418/streams/{stream}/cursors", '{"partition": "0", "type": "AT_OFFSET"}'), 400, "MissingParameter")
    expect_raw_error(raw("POST", f"/20180418/streams/{stream}/cursors", '{"partition": "0", "type": "AT_TIME", "time": "noon"}'), 400, "InvalidParameter")
    assert_empty(stream)


def bad_base64():
    stream = new_stream()
    path = f"/20180418/streams/{stream}/messages"
    body = {"messages": [{"value": b64("fine")}, {"value": "%%%not base64%%%"}]}
    expect_raw_error(raw("POST", path, json.dumps(body)), 400, "InvalidParameter")
    body = {"messages": [{"key": "***", "value": b64("fine")}]}
    expect_raw_error(raw("POST", path, json.dumps(body)), 400, "InvalidParameter")
    assert_empty(stream)


def unknown_streams():
    c = client()
    details = oci.streaming.models.PutMessagesDetails(messages=[oci.streaming.models.PutMessagesDetailsEntry(value=b64("x"))])
    expect_error(404, "NotAuthorizedOrNotFound", c.put_messages, "no-such-stream", details)
    expect_error(404, "NotAuthorizedOrNotFound", c.create_cursor, "no-such-stream",
                 oci.streaming.models.CreateCursorDetails(partition="0", type="LATEST"))
    expect_error(404, "NotAuthorizedOrNotFound", c.create_group_cursor, "no-such-stream",
                 oci.streaming.models.CreateGroupCursorDetails(group_name="g", type="LATEST"))
    stream = new_stream()
    expect_error(404, "NotAuthorizedOrNotFound", c.get_group, stream, "no-such-group")
    r = requests.get(url() + "/20180418/nothing/here", timeout=10)
    expect_raw_error(r, 404, "NotFound")


def forged_cursors():
    c = client()
    stream, other = new_stream(), new_stream()
    put(c, stream, [(None, "secret")])
    good = cursor(c, stream, 0, "TRIM_HORIZON")
    flipped = good[:10] + ("A" if good[10] != "A" else "B") + good[11:]
    expect_error(400, "InvalidParameter", c.get_messages, stream, flipped)
    expect_error(400, "InvalidParameter", c.get_messages, stream, "not-a-cursor")
    expect_error(400, "InvalidParameter", c.get_messages, stream, good + "AA")
    e = expect_error(400, "InvalidParameter", c.get_messages, other, good)
    assert "belongs to stream" in e.message
    # A partition cursor is not a group cursor.
    expect_error(400, "InvalidParameter", c.consumer_commit, stream, good)
    g = group_cursor(c, stream, "g", "i")
    expect_error(400, "InvalidParameter", c.consumer_heartbeat, stream, g[:-2] + "zz")
    messages, _ = get(c, stream, good)
    assert len(messages) == 1, "the genuine cursor still works"


def oversize_messages():
    stream = new_stream()
    path = f"/20180418/streams/{stream}/messages"
    one_too_big = {"messages": [{"value": b64(b"x" * (1024 * 1024 + 1))}]}
    expect_raw_error(raw("POST", path, json.dumps(one_too_big)), 413, "RequestEntityTooLarge")
    together_too_big = {"messages": [{"value": b64(b"x" * (600 * 1024))}, {"value": b64(b"y" * (600 * 1024))}]}
    expect_raw_error(raw("POST", path, json.dumps(together_too_big)), 413, "RequestEntityTooLarge")
    huge_body = '{"messages": [{"value": "' + "A" * (3 * 1024 * 1024) + '"}]}'
    expect_raw_error(raw("POST", path, huge_body), 413, "RequestEntityTooLarge")
    long_key = {"messages": [{"key": b64(b"k" * 257), "value": b64("v")}]}
    expect_raw_error(raw("POST", path, json.dumps(long_key)), 400, "InvalidParameter")
    assert_empty(stream)


def bad_signatures():
    stream = new_stream()
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = os.path.join(os.environ["WORK_DIR"], "stranger.pem")
    with open(path, "wb") as f:
        f.write(stranger.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    c = client(key_file=path)
    details = oci.streaming.models.PutMessagesDetails(messages=[oci.streaming.models.PutMessagesDetailsEntry(value=b64("x"))])
    expect_error(401, "NotAuthenticated", c.put_messages, stream, details)
    expect_error(401, "NotAuthenticated", c.create_cursor, stream,
                 oci.streaming.models.CreateCursorDetails(partition="0", type="LATEST"))
    unsigned = requests.post(url() + f"/20180418/streams/{stream}/messages", data=json.dumps(
        {"messages": [{"value": b64("x")}]}), headers={"content-type": "application/json"}, timeout=10)
    expect_raw_error(unsigned, 401, "NotAuthenticated")
    wrong_digest = raw("POST", f"/20180418/streams/{stream}/messages", json.dumps({"messages": [{"value": b64("x")}]}),
                       headers={"x-content-sha256": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="})
    expect_raw_error(wrong_digest, 401, "NotAuthenticated")
    admin = requests.get(url() + "/admin/v1/hubs", timeout=10)
    expect_raw_error(admin, 401, "NotAuthenticated")
    assert_empty(stream)


def group_limits():
    c = client()
    stream = new_stream()
    for i in range(50):
        group_cursor(c, stream, f"group-{i}", "i")
    e = expect_error(400, "LimitExceeded", c.create_group_cursor, stream,
                     oci.streaming.models.CreateGroupCursorDetails(group_name="group-50", type="LATEST"))
    assert "50" in e.message
    expect_error(400, "InvalidParameter", c.create_group_cursor, stream,
                 oci.streaming.models.CreateGroupCursorDetails(group_name="group-0", type="LATEST", timeout_in_ms=5))


def make_cursor():
    c = client()
    stream = new_stream()
    print("STREAM=" + stream)
    print("CURSOR=" + cursor(c, stream, 0, "TRIM_HORIZON"))


def expired_cursor():
    c = client()
    e = expect_error(400, "InvalidParameter", c.get_messages, os.environ["STREAM"], os.environ["CURSOR"])
    assert "expired" in e.message, e.message


run({
    "bad_json": bad_json,
    "bad_base64": bad_base64,
    "unknown_streams": unknown_streams,
    "forged_cursors": forged_cursors,
    "oversize_messages": oversize_messages,
    "bad_signatures": bad_signatures,
    "group_limits": group_limits,
} if os.environ.get("PHASE") is None else {
    "make_cursor": make_cursor,
    "expired_cursor": expired_cursor,
})
