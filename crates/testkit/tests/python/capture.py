"""Event Hubs Capture as a pipeline written against Azure sees it: events sent with the official
SDK (azure-eventhub), capture files read with fastavro, notifications read with the SDK. Each
command prints one JSON document.

  send    {"conn", "hub", "partition", "count", "bytes", "start"}: `count` events of about
          `bytes` bytes (body `capture-<n>` padded), each with properties n (int) and tag (str)
  files   {"dir"}: every record of every `.avro` file below dir, by file
  consume {"conn", "hub", "count"}: `count` events from the earliest of every partition
  blob-container {"connection_string", "container"}: creates the Blob Storage container
  blobs   {"connection_string", "container"}: every record of every Parquet blob, by blob, read
          with pyarrow after the official azure-storage-blob SDK listed and downloaded it
          (EnqueuedTimeUtc as epoch milliseconds)
"""

import base64
import json
import os
import sys
import threading

import io

import fastavro
import pyarrow.parquet as pq
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.storage.blob import BlobServiceClient


def cmd_send(args):
    client = EventHubProducerClient.from_connection_string(args["conn"], eventhub_name=args["hub"])
    sent = 0
    with client:
        batch = client.create_batch(partition_id=str(args["partition"]))
        for n in range(args["start"], args["start"] + args["count"]):
            body = f"capture-{n}-".encode() + b"x" * args["bytes"]
            event = EventData(body)
            event.properties = {"n": n, "tag": f"t{n % 3}"}
            try:
                batch.add(event)
            except ValueError:
                client.send_batch(batch)
                batch = client.create_batch(partition_id=str(args["partition"]))
                batch.add(event)
            sent += 1
        client.send_batch(batch)
    return {"sent": sent}


def text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def cmd_files(args):
    files = []
    for root, _dirs, names in os.walk(args["dir"]):
        for name in sorted(names):
            if not name.endswith(".avro"):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                reader = fastavro.reader(f)
                records = []
                for r in reader:
                    records.append({
                        "SequenceNumber": r["SequenceNumber"],
                        "Offset": r["Offset"],
                        "EnqueuedTimeUtc": r["EnqueuedTimeUtc"],
                        "Properties": {k: text(v) for k, v in r["Properties"].items()},
                        "Body": base64.b64encode(r["Body"]).decode(),
                    })
            files.append({"path": os.path.relpath(path, args["dir"]), "records": records})
    files.sort(key=lambda f: f["path"])
    return {"files": files}


def cmd_consume(args):
    client = EventHubConsumerClient.from_connection_string(
        args["conn"], consumer_group="$Default", eventhub_name=args["hub"])
    bodies = []
    content_types = []
    done = threading.Event()

    def on_event(_context, event):
        if event is None:
            return
        bodies.append(json.loads(event.body_as_str()))
        content_types.append(event.content_type)
        if len(bodies) >= args["count"]:
            done.set()

    worker = threading.Thread(target=lambda: client.receive(
        on_event=on_event, starting_position="-1", max_wait_time=1))
    worker.start()
    done.wait(timeout=args.get("timeout", 30))
    client.close()
    worker.join()
    return {"events": bodies, "content_types": content_types}


def cmd_blob_container(args):
    service = BlobServiceClient.from_connection_string(args["connection_string"])
    service.create_container(args["container"])
    return {"created": args["container"]}


def union_value(branches):
    """A Parquet map value (one field per Avro union branch) as the one value it holds."""
    for name in ("long", "double", "string", "bytes"):
        if branches.get(name) is not None:
            return text(branches[name])
    return None


def cmd_blobs(args):
    service = BlobServiceClient.from_connection_string(args["connection_string"])
    container = service.get_container_client(args["container"])
    files = []
    for blob in sorted(container.list_blobs(), key=lambda b: b.name):
        data = container.download_blob(blob.name).readall()
        records = []
        for row in pq.read_table(io.BytesIO(data)).to_pylist():
            records.append({
                "SequenceNumber": row["SequenceNumber"],
                "Offset": row["Offset"],
                "EnqueuedTimeUtc": int(row["EnqueuedTimeUtc"].timestamp() * 1000),
                "Properties": {k: union_value(v) for k, v in row["Properties"]},
                "Body": base64.b64encode(row["Body"]).decode(),
            })
        files.append({"path": blob.name, "records": records})
    return {"files": files}


if __name__ == "__main__":
    command, arguments = sys.argv[1], json.loads(sys.argv[2])
    commands = {"send": cmd_send, "files": cmd_files, "consume": cmd_consume,
                "blob-container": cmd_blob_container, "blobs": cmd_blobs}
    print(json.dumps(commands[command](arguments)))
