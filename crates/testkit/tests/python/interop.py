"""Drives the official azure-eventhub Python SDK against a Tributary AMQP listener.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust interop tests (crates/amqp/tests/python_interop.rs) start the broker and the listener,
run this script and assert on that document. Exit code 0 means the scenario ran (its outcome,
success or an expected error, is in the JSON); anything else is a harness failure.

Usage: interop.py <command> <json-arguments>
"""

import datetime
import json
import logging
import os
import sys
import threading
import time
import traceback
import uuid

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient, TransportType
from azure.eventhub.exceptions import ConnectError

TIMEOUT_S = 30


def describe_value(value):
    """A property value as [python type name, JSON-able value]."""
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if isinstance(value, uuid.UUID):
        return ["uuid", str(value)]
    if isinstance(value, datetime.datetime):
        return ["datetime", int(value.timestamp() * 1000)]
    return [type(value).__name__, value]


def describe_event(event):
    props = {}
    for key, value in (event.properties or {}).items():
        key = key.decode() if isinstance(key, bytes) else key
        props[key] = describe_value(value)
    out = {
        "body": event.body_as_str(),
        "sequence_number": event.sequence_number,
        "offset": event.offset,
        "enqueued_ms": int(event.enqueued_time.timestamp() * 1000) if event.enqueued_time else None,
        "partition_key": event.partition_key.decode() if isinstance(event.partition_key, bytes) else event.partition_key,
        "properties": props,
        "content_type": event.content_type,
        "correlation_id": event.correlation_id,
        "message_id": event.message_id,
        "delivery_annotations": {
            (k.decode() if isinstance(k, bytes) else k): describe_value(v.decode() if isinstance(v, bytes) else v)
            for k, v in (event.raw_amqp_message.delivery_annotations or {}).items()
        },
    }
    return out


def error_doc(error):
    return {
        "error_type": type(error).__name__,
        "error": str(error),
        "error_chain": [type(e).__name__ for e in _chain(error)],
    }


def _chain(error):
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__ or getattr(error, "exception", None)
    return seen


def transport(args):
    """The transport options a scenario asks for: `verify`, the CA file an AMQPS (or WSS)
    server's certificate is checked against (the SDK's `connection_verify`), `endpoint`, where
    to connect when it is not the default port (the SDK's `custom_endpoint_address`, which takes
    its port from the address), and `websocket`, AMQP over WebSockets to `endpoint` (the SDK
    appends `/$servicebus/websocket`; `ws://` with `UseDevelopmentEmulator=true`, else `wss://`)."""
    options = {}
    if "verify" in args:
        options["connection_verify"] = args["verify"]
    if "endpoint" in args:
        options["custom_endpoint_address"] = args["endpoint"]
        websocket = args.get("websocket", False)
        options["transport_type"] = TransportType.AmqpOverWebsocket if websocket else TransportType.Amqp
    return options


def retries(args):
    """The SDK's `retry_total`, when a scenario sets one."""
    return {"retry_total": args["retry_total"]} if "retry_total" in args else {}


def producer(args):
    return EventHubProducerClient.from_connection_string(
        args["conn"], eventhub_name=args["hub"], **transport(args), **retries(args)
    )


def consumer(args, conn=None, **kwargs):
    return EventHubConsumerClient.from_connection_string(
        conn or args["conn"],
        consumer_group=args.get("group", "$Default"),
        eventhub_name=args["hub"],
        **transport(args),
        **retries(args),
        **kwargs,
    )


def cmd_produce(args):
    """Partition-key batches, explicit-partition batches, single events, typed properties."""
    with producer(args) as client:
        batch = client.create_batch(partition_key="alpha")
        for i in range(3):
            batch.add(EventData(f"key-{i}"))
        client.send_batch(batch)

        batch = client.create_batch(partition_id="1")
        batch.add(EventData("p1-a"))
        batch.add(EventData("p1-b"))
        client.send_batch(batch)

        client.send_event(EventData("single-keyed"), partition_key="beta")
        client.send_batch([EventData("list-0"), EventData("list-1")], partition_id="0")

        typed = EventData("typed")
        typed.properties = {
            "str": "text",
            "int": 42,
            "negative": -7,
            "float": 2.5,
            "bool": True,
            "bytes": b"\x00\x01",
            "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "time": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
            "none": None,
        }
        typed.content_type = "application/json"
        typed.correlation_id = "corr-1"
        typed.message_id = "msg-1"
        client.send_batch([typed], partition_id="2")
        return {"ok": True, "partition_ids": client.get_partition_ids()}


def cmd_properties(args):
    """The hub's and every partition's properties, and the error for a partition it does not
    have."""
    with producer(args) as client:
        hub = client.get_eventhub_properties()
        partitions = [client.get_partition_properties(p) for p in hub["partition_ids"]]
        try:
            client.get_partition_properties("99")
            missing = None
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            missing = error_doc(e)
    for p in partitions:
        p["last_enqueued_time_utc"] = p["last_enqueued_time_utc"].timestamp() if p["last_enqueued_time_utc"] else None
    hub["created_at"] = hub["created_at"].timestamp()
    return {"eventhub": hub, "partitions": partitions, "missing_partition": missing}


def starting_position(args):
    kind = args["position"]
    if kind == "earliest":
        return "-1"
    if kind == "latest":
        return "@latest"
    if kind == "offset":
        return str(args["value"])
    if kind == "sequence":
        return int(args["value"])
    if kind == "time":
        return datetime.datetime.fromtimestamp(args["value"] / 1000, tz=datetime.timezone.utc)
    raise ValueError(kind)


class Collector:
    """Receives from one partition on a thread until `count` events, an error, or the timeout."""

    def __init__(self, args, conn=None, owner_level=None, position=None, **client_kwargs):
        self.client = consumer(args, conn, **client_kwargs)
        self.events = []
        self.errors = []
        self.last_enqueued = None
        self.got_event = threading.Event()
        self.got_error = threading.Event()
        self.count = args.get("count", 0)
        self.done = threading.Event()
        kwargs = dict(
            on_event=self.on_event,
            on_error=self.on_error,
            partition_id=str(args.get("partition", "0")),
            starting_position=position if position is not None else starting_position(args),
            starting_position_inclusive=args.get("inclusive", False),
            track_last_enqueued_event_properties=True,
            max_wait_time=1,
        )
        if owner_level is not None:
            kwargs["owner_level"] = owner_level
        self.thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
        self.thread.start()

    def _run(self, **kwargs):
        try:
            self.client.receive(**kwargs)
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            self.on_error(None, e)

    def on_event(self, context, event):
        if event is None:
            return
        self.events.append(describe_event(event))
        self.last_enqueued = context.last_enqueued_event_properties
        self.got_event.set()
        if self.count and len(self.events) >= self.count:
            self.done.set()

    def on_error(self, _context, error):
        self.errors.append(error_doc(error))
        self.got_error.set()

    def close(self):
        self.client.close()
        self.thread.join(timeout=TIMEOUT_S)

    def result(self):
        last = None
        if self.last_enqueued:
            last = dict(self.last_enqueued)
            for k, v in last.items():
                if isinstance(v, datetime.datetime):
                    last[k] = int(v.timestamp() * 1000)
        return {"events": self.events, "errors": self.errors, "last_enqueued": last}


def cmd_consume(args):
    collector = Collector(args)
    collector.done.wait(timeout=args.get("timeout", TIMEOUT_S))
    collector.close()
    return collector.result()


def cmd_steal(args):
    """A receiver with owner level 0 is displaced by one with owner level 1."""
    low = Collector(args, owner_level=0, position="-1")
    if not low.got_event.wait(timeout=TIMEOUT_S):
        low.close()
        return {"error": "the owner-level-0 receiver got no event", **low.result()}
    high = Collector(args, owner_level=1, position="-1")
    stolen = low.got_error.wait(timeout=TIMEOUT_S)
    high_got = high.got_event.wait(timeout=TIMEOUT_S)
    high.close()
    low.close()
    return {"stolen": stolen, "high_received": high_got, "low": low.result(), "high": high.result()}


def cmd_sixth(args):
    """Five non-epoch receivers are allowed on a partition; the sixth is refused."""
    first = []
    for _ in range(5):
        c = Collector(args, position="-1")
        first.append(c)
    ready = all(c.got_event.wait(timeout=TIMEOUT_S) for c in first)
    # The SDK retries amqp:resource-limit-exceeded inside each receive call; without retries the
    # broker's refusal reaches on_error at once.
    sixth = Collector(args, position="-1", retry_total=0)
    refused = sixth.got_error.wait(timeout=TIMEOUT_S)
    sixth.close()
    for c in first:
        c.close()
    return {
        "five_ready": ready,
        "five_errors": [e for c in first for e in c.errors],
        "sixth_refused": refused,
        "sixth": sixth.result(),
    }


def cmd_send_expect(args):
    """Sends one event; reports the outcome (used with bad credentials)."""
    try:
        with producer(args) as client:
            client.send_batch([EventData("should-not-arrive")], partition_id="0")
        return {"sent": True}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"sent": False, **error_doc(e)}


def cmd_send_batch(args):
    """Sends `count` events `<prefix>-<i>` in one batch to partition `partition`; reports the
    outcome."""
    try:
        with producer(args) as client:
            batch = client.create_batch(partition_id=str(args.get("partition", 0)))
            for i in range(args["count"]):
                batch.add(EventData(f"{args['prefix']}-{i}"))
            client.send_batch(batch, timeout=args.get("timeout", TIMEOUT_S))
        return {"sent": True}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"sent": False, **error_doc(e)}


def cmd_create_batch(args):
    """Creates a batch for partition 0, which opens the producer's send link (as the SDK's live
    test `test_client_invalid_credential` does with a hub that does not exist), with the SDK's
    retries or `retry_total`; reports the outcome and how long it took."""
    started = time.monotonic()
    try:
        with producer(args) as client:
            client.create_batch(partition_id="0")
        return {"created": True, "elapsed_s": time.monotonic() - started}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"created": False, "elapsed_s": time.monotonic() - started,
                "connect_error": isinstance(e, ConnectError), **error_doc(e)}


def cmd_properties_expect(args):
    try:
        with producer(args) as client:
            return {"ok": True, "partition_ids": client.get_partition_ids()}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"ok": False, **error_doc(e)}


def refused_event(kind, args):
    """The event a refusal scenario sends (see cmd_send_refused)."""
    if kind == "oversize":
        return EventData(b"x" * args["bytes"])
    if kind == "non-string-key":
        event = EventData("keyed-by-a-number")
        event.raw_amqp_message.annotations = {b"x-opt-partition-key": 5}
        return event
    raise ValueError(f"unknown refusal kind {kind}")


def cmd_send_refused(args):
    """Sends one event the server refuses; reports the error the SDK raised and how long the
    send took (a refusal must raise within the send's timeout, never hang)."""
    started = time.monotonic()
    try:
        with producer(args) as client:
            event = refused_event(args["kind"], args)
            client.send_batch([event], partition_id=args.get("partition"), timeout=args["timeout"])
        return {"sent": True, "elapsed_s": time.monotonic() - started}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"sent": False, "elapsed_s": time.monotonic() - started, **error_doc(e)}


def cmd_send_until_refused(args):
    """Sends batches of `bytes`-sized events to partition 0 until the server refuses one (a
    full disk); reports how many batches were acknowledged and the error of the refused one."""
    started = time.monotonic()
    acknowledged = 0
    with producer(args) as client:
        for _ in range(args["batches_max"]):
            batch_started = time.monotonic()
            try:
                events = [EventData(b"%08d" % (acknowledged * args["events"] + i) + b"x" * args["bytes"])
                          for i in range(args["events"])]
                client.send_batch(events, partition_id="0", timeout=args["timeout"])
                acknowledged += 1
            except Exception as e:  # noqa: BLE001 - reported in the JSON
                return {"refused": True, "acknowledged": acknowledged,
                        "elapsed_s": time.monotonic() - batch_started, **error_doc(e)}
    return {"refused": False, "acknowledged": acknowledged, "elapsed_s": time.monotonic() - started}


def cmd_send_delivery_annotations(args):
    """Sends an AmqpAnnotatedMessage with delivery annotations, as the SDK's live test
    `test_send_amqp_annotated_message` does: pyamqp writes that section after the body, which
    the service accepts, keeps and delivers."""
    from azure.eventhub.amqp import AmqpAnnotatedMessage

    message = AmqpAnnotatedMessage(
        data_body=[b"annotated"],
        delivery_annotations={"delann_key": "delann_value"},
        annotations={"x-opt-custom": "kept"},
        application_properties={"source": "pyamqp"},
    )
    try:
        with producer(args) as client:
            client.send_batch([message], partition_id="0", timeout=args["timeout"])
        return {"sent": True}
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"sent": False, **error_doc(e)}


def cmd_websocket_header(args):
    """Opens AMQP over WebSockets at `url` with the SDK's WebSocket library (websocket-client),
    trusting `verify`, sends the SASL protocol header and reports the server's first 8 bytes."""
    import ssl

    import websocket

    sslopt = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": args["verify"]} if "verify" in args else None
    try:
        sock = websocket.create_connection(args["url"], subprotocols=["AMQPWSB10"], timeout=TIMEOUT_S,
                                           sslopt=sslopt)
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return {"connected": False, **error_doc(e)}
    try:
        sock.send_binary(b"AMQP\x03\x01\x00\x00")
        answer = b""
        while len(answer) < 8:
            answer += sock.recv()
        return {"connected": True, "answer": answer[:8].hex()}
    finally:
        sock.close()


def cmd_low_level_receive(args):
    """Receives with the SDK's low-level pyamqp ReceiveClient, whose link carries no selector
    filter: the service starts such a link at the beginning of the partition."""
    from azure.eventhub._pyamqp import ReceiveClient

    client = consumer(args)
    config = client._config
    host = client._address.hostname
    source = f"amqp://{host}/{args['hub']}/ConsumerGroups/$Default/Partitions/{args['partition']}"
    receiver = ReceiveClient(
        host, source, auth=client._create_auth(), use_tls=False, port=config.connection_port,
        custom_endpoint_address=config.custom_endpoint_address, transport_type=config.transport_type,
    )
    receiver.open()
    try:
        bodies = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(bodies) < args["count"] and time.monotonic() < deadline:
            for message in receiver.receive_message_batch(max_batch_size=args["count"], timeout=2):
                bodies.append(b"".join(message.data).decode())
        return {"bodies": bodies}
    finally:
        receiver.close()
        client.close()


COMMANDS = {
    "send-refused": cmd_send_refused,
    "send-until-refused": cmd_send_until_refused,
    "send-delivery-annotations": cmd_send_delivery_annotations,
    "low-level-receive": cmd_low_level_receive,
    "websocket-header": cmd_websocket_header,
    "produce": cmd_produce,
    "properties": cmd_properties,
    "consume": cmd_consume,
    "steal": cmd_steal,
    "sixth": cmd_sixth,
    "send-expect": cmd_send_expect,
    "send-batch": cmd_send_batch,
    "create-batch": cmd_create_batch,
    "properties-expect": cmd_properties_expect,
}


def main():
    if os.environ.get("INTEROP_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
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
