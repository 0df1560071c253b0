"""One EventHubConsumerClient (azure.eventhub.aio) with the blob checkpoint store, in its own process.

Driven by crates/testkit/tests/python_checkpoint_store.rs and blob_fleet.rs, the CLI's
mixed_fleet.rs and the store_requests benchmark: it balances the hub's partitions with the
other processes that share the checkpoint store (Azurite), processes every event, checkpoints
every `checkpoint_every`-th event of a partition (sequence numbers n with n % k == k - 1), and
reports everything it does as one JSON document per line on stdout:

  {"kind": "ready", "namespace": "…"}                the client is receiving; its blobs' namespace
  {"kind": "init", "partition": "3"}                  a partition was claimed
  {"kind": "close", "partition": "3", "reason": ...}  a partition was closed
  {"kind": "event", "partition": "3", "seq": 7, "offset": "…", "body": "…"}
  {"kind": "checkpoint", "partition": "3", "seq": 9, "offset": "…"}   written to the store
  {"kind": "error", "partition": "3" | null, "error": "…"}
  {"kind": "stopped", "checkpoints": {...}, "ownership": {...}}      after "stop" on stdin

It stops (EventHubConsumerClient.close, which releases its ownerships) when a line "stop" arrives
on stdin, then prints the checkpoints and ownerships in the store and exits 0.

Usage: processor.py <json-arguments>
  {"conn", "hub", "storage", "container", "checkpoint_every", "load_balancing_interval",
   "custom_endpoint"}
With "load_balancing_interval" null the SDK's defaults apply (30 s, ownership expiring after 6
intervals); otherwise ownership expires after 10 intervals.

The processor keys its blobs by the connection string's Endpoint as written, `host:port` when it
names a port; the .NET and JavaScript processors (and Tributary) use the bare host. To share a
container with them on a hub at a non-default port, give a connection string whose Endpoint has
no port (`sb://localhost`) and the real address as `custom_endpoint` (`sb://127.0.0.1:PORT`):
the client then connects there over plain AMQP (TLS stays off in emulator mode) and keys its
blobs by `localhost`.
"""

import asyncio
import json
import logging
import os
import sys

from azure.core.exceptions import ResourceExistsError
from azure.eventhub import TransportType
from azure.eventhub.aio import EventHubConsumerClient
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore


def emit(**doc):
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


async def ensure_container(store):
    # The store assumes its container exists; both processes try, one wins.
    try:
        await store._container_client.create_container()  # noqa: SLF001 - the store's own client
    except ResourceExistsError:
        pass


async def stop_requested():
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "stop":
            return


async def run(args):
    store = BlobCheckpointStore.from_connection_string(args["storage"], args["container"])
    await ensure_container(store)
    balancing = {}
    if args.get("load_balancing_interval") is not None:
        interval = float(args["load_balancing_interval"])
        balancing = {"load_balancing_interval": interval, "partition_ownership_expiration_interval": interval * 10}
    endpoint = {}
    if args.get("custom_endpoint"):
        endpoint = {"custom_endpoint_address": args["custom_endpoint"], "transport_type": TransportType.Amqp}
    client = EventHubConsumerClient.from_connection_string(
        args["conn"],
        consumer_group="$Default",
        eventhub_name=args["hub"],
        checkpoint_store=store,
        **balancing,
        **endpoint,
    )
    every = int(args.get("checkpoint_every", 5))

    async def on_event(context, event):
        if event is None:
            return
        seq = event.sequence_number
        emit(kind="event", partition=context.partition_id, seq=seq, offset=event.offset, body=event.body_as_str())
        if seq % every == every - 1:
            await context.update_checkpoint(event)
            emit(kind="checkpoint", partition=context.partition_id, seq=seq, offset=event.offset)

    async def on_partition_initialize(context):
        emit(kind="init", partition=context.partition_id)

    async def on_partition_close(context, reason):
        emit(kind="close", partition=context.partition_id, reason=str(reason))

    async def on_error(context, error):
        emit(kind="error", partition=context.partition_id if context else None, error=repr(error))

    receiving = asyncio.create_task(
        client.receive(
            on_event=on_event,
            on_error=on_error,
            on_partition_initialize=on_partition_initialize,
            on_partition_close=on_partition_close,
            starting_position="-1",
        )
    )
    # The namespace the processor keys its blobs by (EventProcessor uses the same attribute).
    fqns = client._address.hostname  # noqa: SLF001
    emit(kind="ready", namespace=fqns)
    waiting = asyncio.create_task(stop_requested())
    done, _ = await asyncio.wait({receiving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if receiving in done:
        # receive() only returns on close; anything else is a harness failure.
        receiving.result()
        raise RuntimeError("receive() returned before stop")
    await client.close()
    await receiving

    checkpoints = {
        c["partition_id"]: {"offset": c.get("offset"), "seq": c.get("sequence_number")}
        for c in await store.list_checkpoints(fqns, args["hub"], "$Default")
    }
    ownership = {o["partition_id"]: o["owner_id"] for o in await store.list_ownership(fqns, args["hub"], "$Default")}
    await store.close()
    emit(kind="stopped", checkpoints=checkpoints, ownership=ownership)


def main():
    if os.environ.get("INTEROP_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    asyncio.run(run(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
