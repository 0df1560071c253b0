"""Lists and downloads a capture container with the official Blob Storage SDK, as a pipeline
reading Azure Event Hubs Capture would, and reads every file: Avro with fastavro, Parquet with
pyarrow and again with duckdb. Prints one JSON document: per blob its name, size and records,
each record as {SequenceNumber, Offset, EnqueuedTimeUtc, SystemProperties, Properties, Body}
with bytes as lists of ints and Parquet timestamps as epoch milliseconds.

Usage: capture_blobs.py CONNECTION_STRING CONTAINER"""

import io
import json
import sys
import tempfile

import duckdb
import fastavro
import pyarrow.parquet as pq
from azure.storage.blob import BlobServiceClient


def plain(value):
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def union(branches):
    """A Parquet map value (one field per Avro union branch) as the one value it holds."""
    for name in ("long", "double", "string", "bytes"):
        if branches.get(name) is not None:
            return plain(branches[name])
    return None


def parquet_records(data):
    table = pq.read_table(io.BytesIO(data))
    records = []
    for row in table.to_pylist():
        records.append({
            "SequenceNumber": row["SequenceNumber"],
            "Offset": row["Offset"],
            "EnqueuedTimeUtc": int(row["EnqueuedTimeUtc"].timestamp() * 1000),
            "SystemProperties": {k: union(v) for k, v in row["SystemProperties"]},
            "Properties": {k: union(v) for k, v in row["Properties"]},
            "Body": plain(row["Body"]),
        })
    schema = {f.name: str(f.type) for f in table.schema}
    return records, schema


def duckdb_rows(data):
    with tempfile.NamedTemporaryFile(suffix=".parquet") as f:
        f.write(data)
        f.flush()
        rows = duckdb.sql(
            'SELECT "SequenceNumber", "Offset", epoch_ms("EnqueuedTimeUtc"), "Body", '
            'map_keys("Properties") FROM read_parquet(?) ORDER BY "SequenceNumber"',
            params=[f.name],
        ).fetchall()
    return [[r[0], r[1], r[2], plain(r[3]), sorted(r[4])] for r in rows]


def main(connection_string, container):
    service = BlobServiceClient.from_connection_string(connection_string)
    client = service.get_container_client(container)
    blobs = []
    for blob in client.list_blobs():
        data = client.download_blob(blob.name).readall()
        entry = {"name": blob.name, "size": blob.size, "blob_type": str(blob.blob_type)}
        if blob.name.endswith(".avro"):
            entry["records"] = [plain(r) for r in fastavro.reader(io.BytesIO(data))]
        else:
            entry["records"], entry["schema"] = parquet_records(data)
            entry["duckdb"] = duckdb_rows(data)
        blobs.append(entry)
    print(json.dumps({"blobs": blobs}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
