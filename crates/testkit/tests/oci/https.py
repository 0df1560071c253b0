"""The official oci SDK over HTTPS: stream administration and messages with the server's
certificate checked against our development authority (REQUESTS_CA_BUNDLE, set by the Rust
test), and a client that trusts another authority refused before any request is made."""

import os

import oci

from tributary_oci import admin_client, client, cursor, get, put, run, unb64, url

COMPARTMENT = "ocid1.compartment.oc1..aaaatributarytest"


def administer_and_use_a_stream_over_https():
    assert url().startswith("https://"), url()
    admin = admin_client()
    details = oci.streaming.models.CreateStreamDetails(name="tls", partitions=1, compartment_id=COMPARTMENT)
    stream = admin.create_stream(details).data
    assert stream.messages_endpoint == url(), (stream.messages_endpoint, url())
    c = client()
    assert put(c, "tls", [("k", "over tls")]).failures == 0
    got, _ = get(c, "tls", cursor(c, "tls", 0, "TRIM_HORIZON"))
    assert [unb64(m.value) for m in got] == [b"over tls"], got


def another_authority_is_refused():
    ours = os.environ["REQUESTS_CA_BUNDLE"]
    os.environ["REQUESTS_CA_BUNDLE"] = os.environ["WRONG_CA"]
    try:
        put(client(), "tls", [("k", "must not arrive")])
    except Exception as e:  # noqa: BLE001 - the SDK wraps its vendored SSLError in RequestException
        assert "CERTIFICATE_VERIFY_FAILED" in str(e), e
    else:
        raise AssertionError("a server signed by another authority was trusted")
    finally:
        os.environ["REQUESTS_CA_BUNDLE"] = ours
    got, _ = get(client(), "tls", cursor(client(), "tls", 0, "TRIM_HORIZON"))
    assert [unb64(m.value) for m in got] == [b"over tls"], got


if __name__ == "__main__":
    run({
        "administer_and_use_a_stream_over_https": administer_and_use_a_stream_over_https,
        "another_authority_is_refused": another_authority_is_refused,
    })
