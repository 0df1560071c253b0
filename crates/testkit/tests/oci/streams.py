"""Stream administration through the official oci SDK's StreamAdminClient: create, get, list
(with paging and sorting) and delete streams, then use a created stream with a StreamClient at
the messagesEndpoint the stream reports."""

import uuid

import oci

from tributary_oci import (
    admin_client, b64, config, cursor, expect_error, get, put, run, unb64, url,
)

COMPARTMENT = "ocid1.compartment.oc1..aaaatributarytest"


def create(admin, name, partitions, retention_hours=None):
    details = oci.streaming.models.CreateStreamDetails(
        name=name,
        partitions=partitions,
        compartment_id=COMPARTMENT,
        retention_in_hours=retention_hours,
        freeform_tags={"team": "pipelines"},
    )
    return admin.create_stream(details).data


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_get_and_use_a_stream():
    admin = admin_client()
    name = unique("adm")
    stream = create(admin, name, 3, retention_hours=48)
    assert stream.id == name and stream.name == name, stream
    assert stream.partitions == 3, stream
    assert stream.retention_in_hours == 48, stream
    assert stream.lifecycle_state == "ACTIVE", stream
    assert stream.compartment_id == COMPARTMENT, stream
    assert stream.messages_endpoint == url(), (stream.messages_endpoint, url())
    assert stream.time_created is not None

    fetched = admin.get_stream(stream.id).data
    assert (fetched.id, fetched.partitions, fetched.retention_in_hours, fetched.lifecycle_state) == (
        name, 3, 48, "ACTIVE"), fetched

    # The stream takes messages at once, through a StreamClient at its messages endpoint.
    messages = oci.streaming.StreamClient(
        config(), service_endpoint=stream.messages_endpoint,
        retry_strategy=oci.retry.NoneRetryStrategy())
    result = put(messages, stream.id, [("k", "hello")])
    assert result.failures == 0, result
    partition = result.entries[0].partition
    got, _ = get(messages, stream.id, cursor(messages, stream.id, partition, "TRIM_HORIZON"))
    assert [unb64(m.value) for m in got] == [b"hello"], got


def list_page_and_sort():
    admin = admin_client()
    prefix = unique("lst")
    names = [f"{prefix}-{i}" for i in range(5)]
    for n in reversed(names):
        create(admin, n, 1)
    # Every page of a paged listing, as the SDK's pagination helper walks them.
    everything = oci.pagination.list_call_get_all_results(
        admin.list_streams, compartment_id=COMPARTMENT, limit=2, sort_by="NAME", sort_order="ASC"
    ).data
    listed = [s.name for s in everything if s.name.startswith(prefix)]
    assert listed == names, listed
    assert all(s.lifecycle_state == "ACTIVE" and s.compartment_id == COMPARTMENT for s in everything)
    first_page = admin.list_streams(compartment_id=COMPARTMENT, limit=2)
    assert len(first_page.data) == 2 and first_page.next_page, first_page.headers
    by_name = admin.list_streams(compartment_id=COMPARTMENT, name=names[2]).data
    assert [s.id for s in by_name] == [names[2]], by_name
    deleted = admin.list_streams(compartment_id=COMPARTMENT, name=names[2], lifecycle_state="DELETED").data
    assert deleted == [], deleted


def delete_and_refusals():
    admin = admin_client()
    name = unique("del")
    create(admin, name, 2)
    expect_error(409, "Conflict", create, admin, name, 2)
    expect_error(400, "InvalidParameter", create, admin, unique("bad"), 0)
    expect_error(400, "InvalidParameter", create, admin, unique("bad"), 1, 0)
    response = admin.delete_stream(name)
    assert response.status == 202, response.status
    expect_error(404, "NotAuthorizedOrNotFound", admin.get_stream, name)
    expect_error(404, "NotAuthorizedOrNotFound", admin.delete_stream, name)
    gone = admin.list_streams(compartment_id=COMPARTMENT, name=name).data
    assert gone == [], gone


run({
    "create_get_and_use_a_stream": create_get_and_use_a_stream,
    "list_page_and_sort": list_page_and_sort,
    "delete_and_refusals": delete_and_refusals,
})
