"""Drives the official azure-eventhub Python SDK against a compacted event hub of Tributary.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust tests (crates/testkit/tests/compacted_hubs.rs) start the hub, run this script and assert on
that document. Exit code 0 means the scenario ran (its outcome, success or an expected error, is
in the JSON); anything else is a harness failure.

Usage: compaction.py <command> <json-arguments>
"""

import json
import sys
import threading
import traceback
import urllib.request

from azure.eventhub import EventData
from azure.eventhub.amqp import AmqpAnnotatedMessage
from azure.eventhub._eventprocessor.in_memory_checkpoint_store import InMemoryCheckpointStore

# The clients, the receiving thread and the error shape are interop.py's.
from interop import TIMEOUT_S, Collector, consumer, describe_event, error_doc, producer


def refusal(client, events, **kwargs):
    """Sends `events` in one batch; None when they were taken, else the SDK's error."""
    try:
        client.send_batch(events, timeout=TIMEOUT_S, **kwargs)
        return None
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return error_doc(e)


def cmd_send(args):
    """Sends `events` ({key, body}; a body of null is a tombstone: the key and an empty body)
    one at a time with their partition keys, then one event without a key and one keyed
    event whose body is an amqp-value; reports the last sequence number of partition 0 and
    the two refusals."""
    with producer(args) as client:
        for event in args["events"]:
            body = event["body"].encode() if event["body"] is not None else b""
            client.send_batch([EventData(body)], partition_key=event["key"])
        keyless = refusal(client, [EventData("no key")])
        value_body = refusal(client, [AmqpAnnotatedMessage(value_body="structured", annotations={})],
                             partition_key="k-value")
        properties = client.get_partition_properties("0")
    return {"keyless": keyless, "value_body": value_body,
            "last_sequence": properties["last_enqueued_sequence_number"]}


class Checkpointer:
    """An EventHubConsumerClient with a checkpoint store (in memory, shared with a later
    client of this process): checkpoints at the event with sequence number `at`, then stops."""

    def __init__(self, args, store, at):
        self.client = consumer(args, checkpoint_store=store)
        self.at = at
        self.first = None
        self.checkpointed = None
        self.errors = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.client.receive(on_event=self.on_event, on_error=self.on_error,
                                starting_position="-1", max_wait_time=1)
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            self.on_error(None, e)

    def on_event(self, context, event):
        if event is None or self.done.is_set():
            return
        if self.first is None:
            self.first = describe_event(event)
        if self.at is not None and event.sequence_number >= self.at:
            context.update_checkpoint(event)
            self.checkpointed = describe_event(event)
            self.done.set()
        elif self.at is None:
            self.done.set()

    def on_error(self, _context, error):
        self.errors.append(error_doc(error))

    def finish(self):
        self.done.wait(timeout=TIMEOUT_S)
        self.client.close()
        self.thread.join(timeout=TIMEOUT_S)


def compact(args):
    """Asks the admin API to compact the hub now; its answer."""
    url = f"{args['admin']}/admin/v1/hubs/{args['hub']}/compact"
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        return json.loads(answer.read())


def read_from_start(args):
    """Every event of partition 0 from the start, read until a second passes without one."""
    collector = Collector({**args, "position": "earliest", "count": 0})
    while collector.got_event.wait(timeout=TIMEOUT_S):
        collector.got_event.clear()
        if not collector.got_event.wait(timeout=3):
            break
    collector.close()
    return collector.result()


def cmd_checkpoint_compact_resume(args):
    """Checkpoints at sequence number `checkpoint_at` with the SDK's checkpoint store, has the
    hub compacted, then resumes from the checkpoint with a new client (the first event it
    gets) and reads the partition from the start."""
    store = InMemoryCheckpointStore()
    before = Checkpointer(args, store, args["checkpoint_at"])
    before.finish()
    compacted = compact(args)
    resumed = Checkpointer(args, store, None)
    resumed.finish()
    return {
        "checkpointed": before.checkpointed,
        "checkpoint_errors": before.errors,
        "compacted": compacted,
        "resumed_first": resumed.first,
        "resume_errors": resumed.errors,
        "from_start": read_from_start(args),
    }


COMMANDS = {
    "send": cmd_send,
    "checkpoint-compact-resume": cmd_checkpoint_compact_resume,
}


def main():
    command, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    try:
        result = COMMANDS[command](args)
    except Exception:  # noqa: BLE001 - a harness failure
        traceback.print_exc()
        sys.exit(2)
    sys.stdout.flush()
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
