"""Reads a capture file with fastavro, as a pipeline written against Azure Event Hubs Capture
would, and prints what it found as one JSON document: the writer schema, the codec and every
record (bytes as lists of ints, so the comparison is exact)."""

import json
import sys

import fastavro


def plain(value):
    if isinstance(value, bytes):
        return list(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def main(path):
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema = reader.writer_schema
        records = [plain(r) for r in reader]
        codec = reader.codec
        header_schema = json.loads(reader.metadata["avro.schema"])
    print(json.dumps({
        "schema": schema,
        "header_schema": header_schema,
        "codec": codec,
        "records": records,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
