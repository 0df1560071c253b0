"""Drives confluent-kafka's AdminClient (librdkafka) against Tributary's Kafka door: topics
created, described, altered, grown and deleted, the cluster described, and records produced with lz4 and
zstd and consumed back.

Each subcommand runs one scenario and prints one JSON document on stdout (the last line); the
Rust tests (crates/testkit/tests/kafka_admin.rs) start the hub and its Kafka door, run this
script and assert on that document. Exit code 0 means the scenario ran (its outcome, success or
an expected error, is in the JSON); anything else is a harness failure.

Usage: kafka_admin.py <command> <json-arguments>
"""


from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                  ConfigSource, NewPartitions, NewTopic, ResourceType)

# The produce and consume scenarios, and the SASL configuration, are kafka_interop.py's.
from kafka_interop import cmd_consume, cmd_produce, config, run

TIMEOUT_S = 30


def admin(args):
    """An AdminClient; the caller holds it until its futures are done (a client dropped
    earlier fails them with _DESTROY)."""
    return AdminClient(config(args))


def outcome(future):
    """None when the future succeeded, else {error, message} from the broker's answer."""
    try:
        future.result(timeout=TIMEOUT_S)
        return None
    except KafkaException as e:
        error = e.args[0]
        return {"error": error.name(), "message": error.str()}


def cmd_create_topics(args):
    """Creates `topics` ({name, partitions?, replication?, config?}), with `validate_only`;
    returns each topic's outcome by name."""
    topics = [
        NewTopic(t["name"], num_partitions=t.get("partitions", -1),
                 replication_factor=t.get("replication", -1), config=t.get("config", {}))
        for t in args["topics"]
    ]
    client = admin(args)
    futures = client.create_topics(
        topics, validate_only=args.get("validate_only", False), request_timeout=TIMEOUT_S)
    return {"results": {name: outcome(f) for name, f in futures.items()}}


def cmd_delete_topics(args):
    """Deletes `topics` (names); returns each topic's outcome by name."""
    client = admin(args)
    futures = client.delete_topics(args["topics"], request_timeout=TIMEOUT_S)
    return {"results": {name: outcome(f) for name, f in futures.items()}}


def cmd_create_partitions(args):
    """Asks topic `topic` to have `count` partitions; returns the outcome."""
    client = admin(args)
    futures = client.create_partitions(
        [NewPartitions(args["topic"], args["count"])], request_timeout=TIMEOUT_S)
    return {"results": {name: outcome(f) for name, f in futures.items()}}


def cmd_describe_configs(args):
    """Describes topic `topic`'s configs, or the broker `broker`'s; returns each config's
    value, source, read-only flag and whether it is the default."""
    if "topic" in args:
        resource = ConfigResource(ResourceType.TOPIC, args["topic"])
    else:
        resource = ConfigResource(ResourceType.BROKER, args["broker"])
    client = admin(args)
    future = client.describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
    try:
        entries = future.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        return {"error": e.args[0].name(), "message": e.args[0].str()}
    configs = {
        name: {
            "value": entry.value,
            "source": ConfigSource(entry.source).name,
            "read_only": entry.is_read_only,
            "default": entry.is_default,
        }
        for name, entry in entries.items()
    }
    return {"configs": configs}


def resource_of(args, configs=None, incremental_configs=None):
    """The topic `topic` or the broker `broker` as a ConfigResource."""
    kind, name = ((ResourceType.TOPIC, args["topic"]) if "topic" in args
                  else (ResourceType.BROKER, args["broker"]))
    return ConfigResource(kind, name, set_config=configs,
                          incremental_configs=incremental_configs)


def cmd_alter_configs(args):
    """Replaces the configs of topic `topic` (or broker `broker`) with `configs` (name →
    value), with `validate_only`; returns the outcome."""
    resource = resource_of(args, configs=args["configs"])
    client = admin(args)
    futures = client.alter_configs(
        [resource], validate_only=args.get("validate_only", False), request_timeout=TIMEOUT_S)
    return {"result": outcome(futures[resource])}


def cmd_incremental_alter_configs(args):
    """Applies `ops` ([op, name, value?] with op SET, DELETE, APPEND or SUBTRACT) to topic
    `topic` (or broker `broker`), with `validate_only`; returns the outcome."""
    entries = [
        ConfigEntry(op[1], op[2] if len(op) > 2 else None,
                    incremental_operation=AlterConfigOpType[op[0]])
        for op in args["ops"]
    ]
    resource = resource_of(args, incremental_configs=entries)
    client = admin(args)
    futures = client.incremental_alter_configs(
        [resource], validate_only=args.get("validate_only", False), request_timeout=TIMEOUT_S)
    return {"result": outcome(futures[resource])}


def cmd_describe_cluster(args):
    """Describes the cluster: its id, controller, nodes and this login's operations."""
    client = admin(args)
    future = client.describe_cluster(
        include_authorized_operations=True, request_timeout=TIMEOUT_S)
    try:
        cluster = future.result(timeout=TIMEOUT_S)
    except KafkaException as e:
        return {"error": e.args[0].name(), "message": e.args[0].str()}
    return {
        "cluster_id": cluster.cluster_id,
        "controller": cluster.controller.id if cluster.controller else None,
        "nodes": [f"{n.id}@{n.host}:{n.port}" for n in cluster.nodes],
        "operations": sorted(op.name for op in (cluster.authorized_operations or [])),
    }


def cmd_partitions(args):
    """The partition count Metadata gives for `topic`, or its error name."""
    meta = admin(args).list_topics(args["topic"], timeout=10)
    topic = meta.topics[args["topic"]]
    if topic.error:
        return {"error": topic.error.name()}
    return {"partitions": len(topic.partitions)}


COMMANDS = {
    "create_topics": cmd_create_topics,
    "delete_topics": cmd_delete_topics,
    "create_partitions": cmd_create_partitions,
    "describe_configs": cmd_describe_configs,
    "alter_configs": cmd_alter_configs,
    "incremental_alter_configs": cmd_incremental_alter_configs,
    "describe_cluster": cmd_describe_cluster,
    "partitions": cmd_partitions,
    "produce": cmd_produce,
    "consume": cmd_consume,
}


if __name__ == "__main__":
    run(COMMANDS)
