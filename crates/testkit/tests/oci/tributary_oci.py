"""Shared helpers for the OCI interop tests: a real `oci` SDK StreamClient with a real request
signer, pointed at the Tributary server the Rust test started (its URL and the key pair it
generated come from the environment)."""

import base64
import os
import sys
import traceback

import oci
import requests

TENANCY = "ocid1.tenancy.oc1..aaaatributarytest"
USER = "ocid1.user.oc1..aaaatributarytest"
FINGERPRINT = "11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00"
KEY_ID = f"{TENANCY}/{USER}/{FINGERPRINT}"


def url():
    return os.environ["TRIBUTARY_URL"]


def config(key_file=None):
    return {
        "user": USER,
        "tenancy": TENANCY,
        "fingerprint": FINGERPRINT,
        "key_file": key_file or os.environ["OCI_KEY_FILE"],
        "region": "us-phoenix-1",
    }


def client(key_file=None):
    """A StreamClient exactly as a user makes one, without retries so errors show at once."""
    return oci.streaming.StreamClient(
        config(key_file), service_endpoint=url(), retry_strategy=oci.retry.NoneRetryStrategy()
    )


def admin_client(key_file=None):
    """A StreamAdminClient (the control plane) exactly as a user makes one, without retries."""
    return oci.streaming.StreamAdminClient(
        config(key_file), service_endpoint=url(), retry_strategy=oci.retry.NoneRetryStrategy()
    )


def signer(key_file=None):
    return oci.signer.Signer(
        TENANCY, USER, FINGERPRINT, private_key_file_location=key_file or os.environ["OCI_KEY_FILE"]
    )


def raw(method, path, body=None, key_file=None, headers=None):
    """A request signed by the SDK's signer but with a body of our choosing."""
    h = {"content-type": "application/json", "accept": "application/json"}
    h.update(headers or {})
    return requests.request(method, url() + path, data=body, headers=h, auth=signer(key_file), timeout=30)


def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def unb64(text):
    return base64.b64decode(text) if text is not None else None


def entry(key, value):
    return oci.streaming.models.PutMessagesDetailsEntry(
        key=None if key is None else b64(key), value=b64(value)
    )


def put(c, stream, pairs):
    details = oci.streaming.models.PutMessagesDetails(messages=[entry(k, v) for k, v in pairs])
    return c.put_messages(stream, details).data


def cursor(c, stream, partition, kind, offset=None, time=None):
    details = oci.streaming.models.CreateCursorDetails(
        partition=str(partition), type=kind, offset=offset, time=time
    )
    return c.create_cursor(stream, details).data.value


def group_cursor(c, stream, group, instance, kind="TRIM_HORIZON", timeout_ms=None, commit_on_get=None, time=None):
    details = oci.streaming.models.CreateGroupCursorDetails(
        group_name=group,
        instance_name=instance,
        type=kind,
        timeout_in_ms=timeout_ms,
        commit_on_get=commit_on_get,
        time=time,
    )
    return c.create_group_cursor(stream, details).data.value


def get(c, stream, cur, limit=None):
    """(messages, next cursor)."""
    response = c.get_messages(stream, cur, limit=limit)
    next_cursor = response.headers.get("opc-next-cursor")
    assert next_cursor, "every GetMessages answer carries opc-next-cursor"
    return response.data, next_cursor


def offsets(messages):
    return [m.offset for m in messages]


def expect_error(status, code, call, *args, **kwargs):
    """Runs an SDK call that must fail with this status and code; returns the error."""
    try:
        call(*args, **kwargs)
    except oci.exceptions.ServiceError as e:
        assert e.status == status, f"expected {status} {code}, got {e.status} {e.code}: {e.message}"
        assert e.code == code, f"expected {status} {code}, got {e.status} {e.code}: {e.message}"
        assert e.request_id, "the error echoes opc-request-id"
        return e
    raise AssertionError(f"expected {status} {code}, but the call succeeded")


def expect_raw_error(response, status, code):
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    body = response.json()
    assert body["code"] == code, f"expected {code}, got {body}"
    assert isinstance(body["message"], str) and body["message"]
    assert response.headers.get("opc-request-id")


def run(tests):
    """Runs each test function; prints PASS/FAIL lines; exits non-zero on the first failure."""
    names = sys.argv[1:] or list(tests)
    for name in names:
        try:
            tests[name]()
        except Exception:
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
            sys.exit(1)
        print(f"PASS {name}", flush=True)
