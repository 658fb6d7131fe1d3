"""The pure cores of topic admin: config changes (AlterConfigs, IncrementalAlterConfigs),
DescribeConfigs entries, CreateTopics/CreatePartitions validation, and the cluster document's
config and partition transitions."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from main_broker.api.config_changes import (
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    ConfigChangeError,
    broker_entries,
    incremental_topic_configs,
    replace_topic_configs,
    topic_entries,
)
from main_broker.api.topics_admin import (
    assignment_error,
    create_partitions_error,
    partitions_error,
    replication_error,
)
from main_broker.cluster.doc import ClusterDoc, PartitionCountChanged, UnknownTopic
from main_broker.topic_config import (
    NO_EFFECT,
    TOPIC_CONFIG_KEYS,
    TYPE_DOUBLE,
    TYPE_LIST,
    TYPE_LONG,
    EffectiveTopicConfig,
)
from zone_router import place_partitions

TOPIC_ID = bytes(range(16))


def test_incremental_set_delete_append_subtract() -> None:
    current = {"retention.ms": "1000", "segment.ms": "5000"}
    out = incremental_topic_configs(
        current,
        [
            ("retention.ms", OP_SET, "2000"),
            ("segment.ms", OP_DELETE, None),
            ("cleanup.policy", OP_APPEND, "compact"),
        ],
    )
    # APPEND starts from the default ("delete") when the key is not set explicitly.
    assert out == {"retention.ms": "2000", "cleanup.policy": "delete,compact"}
    assert incremental_topic_configs(out, [("cleanup.policy", OP_SUBTRACT, "delete")]) == {
        "retention.ms": "2000",
        "cleanup.policy": "compact",
    }
    # Appending what is there already changes nothing; deleting an unset key is no error.
    same = incremental_topic_configs(out, [("cleanup.policy", OP_APPEND, "compact,delete")])
    assert same["cleanup.policy"] == "delete,compact"
    assert incremental_topic_configs({}, [("retention.bytes", OP_DELETE, None)]) == {}
    assert current == {"retention.ms": "1000", "segment.ms": "5000"}  # not mutated


@pytest.mark.parametrize(
    ("ops", "code", "text"),
    [
        ([("retention.ms", OP_APPEND, "5")], ErrorCode.invalid_config, "append is not allowed"),
        ([("retention.ms", OP_SUBTRACT, "5")], ErrorCode.invalid_config, "subtract"),
        ([("no.such", OP_SET, "1")], ErrorCode.invalid_config, "Unknown topic config name"),
        ([("no.such", OP_APPEND, "1")], ErrorCode.invalid_config, "Unknown topic config name"),
        ([("retention.ms", OP_SET, "x")], ErrorCode.invalid_config, "retention.ms"),
        ([("retention.ms", OP_SET, None)], ErrorCode.invalid_request, "Null value"),
        ([("cleanup.policy", OP_APPEND, None)], ErrorCode.invalid_request, "Null value"),
        ([("cleanup.policy", OP_SET, "delete,never")], ErrorCode.invalid_config, "cleanup"),
        ([("min.cleanable.dirty.ratio", OP_SET, "1.5")], ErrorCode.invalid_config, "ratio"),
        ([("delete.retention.ms", OP_SET, "-1")], ErrorCode.invalid_config, "delete.retention"),
        ([("compression.gzip.level", OP_SET, "0")], ErrorCode.invalid_config, "gzip"),
        ([("message.format.version", OP_SET, "x")], ErrorCode.invalid_config, "format"),
        (
            [("min.compaction.lag.ms", OP_SET, "10"), ("max.compaction.lag.ms", OP_SET, "5")],
            ErrorCode.invalid_config,
            "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)",
        ),
        ([("retention.ms", 9, "1")], ErrorCode.invalid_request, "operation"),
        (
            [("retention.ms", OP_SET, "1"), ("retention.ms", OP_DELETE, None)],
            ErrorCode.invalid_request,
            "Error due to duplicate config keys",
        ),
    ],
)
def test_incremental_refusals(
    ops: list[tuple[str, int, str | None]], code: ErrorCode, text: str
) -> None:
    with pytest.raises(ConfigChangeError) as info:
        incremental_topic_configs({}, ops)
    assert info.value.code == code
    assert text in info.value.message


def test_every_kafka_log_config_is_accepted_with_its_type() -> None:
    # Kafka 3.9/4.x LogConfig's topic keys, as clients and tools set them.
    kafka = {
        "cleanup.policy": "compact,delete",
        "compression.gzip.level": "9",
        "compression.lz4.level": "17",
        "compression.type": "zstd",
        "compression.zstd.level": "-5",
        "delete.retention.ms": "1000",
        "file.delete.delay.ms": "0",
        "flush.messages": "10",
        "flush.ms": "0",
        "follower.replication.throttled.replicas": "0:1,1:2",
        "index.interval.bytes": "0",
        "leader.replication.throttled.replicas": "*",
        "local.retention.bytes": "-2",
        "local.retention.ms": "-2",
        "max.compaction.lag.ms": "9000",
        "max.message.bytes": "1000",
        "message.downconversion.enable": "false",
        "message.format.version": "3.0-IV1",
        "message.timestamp.after.max.ms": "0",
        "message.timestamp.before.max.ms": "0",
        "message.timestamp.difference.max.ms": "0",
        "message.timestamp.type": "LogAppendTime",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "5",
        "min.insync.replicas": "2",
        "preallocate": "true",
        "remote.log.copy.disable": "false",
        "remote.log.delete.on.disable": "false",
        "remote.storage.enable": "false",
        "retention.bytes": "-1",
        "retention.ms": "-1",
        "segment.bytes": "14",
        "segment.index.bytes": "4",
        "segment.jitter.ms": "0",
        "segment.ms": "1",
        "unclean.leader.election.enable": "true",
    }
    assert set(TOPIC_CONFIG_KEYS) == set(kafka)
    out = replace_topic_configs(list(kafka.items()))
    assert out["min.cleanable.dirty.ratio"] == "0.01"
    assert TOPIC_CONFIG_KEYS["min.cleanable.dirty.ratio"].config_type == TYPE_DOUBLE
    assert TOPIC_CONFIG_KEYS["delete.retention.ms"].config_type == TYPE_LONG
    assert TOPIC_CONFIG_KEYS["file.delete.delay.ms"].doc.startswith(NO_EFFECT)
    assert TOPIC_CONFIG_KEYS["message.format.version"].doc.startswith(NO_EFFECT)
    assert not TOPIC_CONFIG_KEYS["delete.retention.ms"].doc.startswith(NO_EFFECT)
    effective = EffectiveTopicConfig.from_explicit(out, {})
    assert effective.min_cleanable_dirty_ratio == 0.01
    assert (effective.min_compaction_lag_ms, effective.max_compaction_lag_ms) == (5, 9000)
    assert effective.delete_retention_ms == 1000
    # Defaults as Kafka's, and the broker-level default (its log.cleaner.* synonym) applies.
    default = EffectiveTopicConfig.from_explicit({}, {"delete.retention.ms": "7"})
    assert default.min_cleanable_dirty_ratio == 0.5
    assert (default.min_compaction_lag_ms, default.max_compaction_lag_ms) == (0, 2**63 - 1)
    assert default.delete_retention_ms == 7
    assert TOPIC_CONFIG_KEYS["delete.retention.ms"].broker_key == "log.cleaner.delete.retention.ms"


def test_cleanup_policy_may_be_empty() -> None:
    # Kafka accepts an empty list: neither delete nor compact, the data is kept forever.
    out = incremental_topic_configs({}, [("cleanup.policy", OP_SUBTRACT, "delete")])
    assert out == {"cleanup.policy": ""}
    effective = EffectiveTopicConfig.from_explicit(out, {})
    assert not effective.compacted and not effective.retention_deletes
    assert replace_topic_configs([("cleanup.policy", "")]) == {"cleanup.policy": ""}


def test_replace_is_the_whole_set_and_validated() -> None:
    assert replace_topic_configs([("retention.ms", "10"), ("cleanup.policy", " compact ")]) == {
        "retention.ms": "10",
        "cleanup.policy": "compact",
    }
    assert replace_topic_configs([]) == {}
    with pytest.raises(ConfigChangeError) as info:
        replace_topic_configs([("max.message.bytes", "-1")])
    assert info.value.code == ErrorCode.invalid_config
    with pytest.raises(ConfigChangeError) as info:
        replace_topic_configs([("segment.ms", "1"), ("segment.ms", "2")])
    assert info.value.code == ErrorCode.invalid_request
    # A null value: AlterConfigs refuses the request as Kafka's ConfigAdminManager.preprocess
    # does; CreateTopics' validation calls it an invalid config.
    nulls: list[tuple[str, str | None]] = [("segment.ms", None), ("retention.ms", None)]
    with pytest.raises(ConfigChangeError) as info:
        replace_topic_configs(nulls, null_is_invalid_request=True)
    assert info.value.code == ErrorCode.invalid_request
    assert info.value.message == "Null value not supported for : segment.ms, retention.ms"
    with pytest.raises(ConfigChangeError) as info:
        replace_topic_configs(nulls)
    assert info.value.code == ErrorCode.invalid_config
    # DELETE needs no value.
    assert incremental_topic_configs({"segment.ms": "5"}, [("segment.ms", OP_DELETE, None)]) == {}


def test_topic_entries_sources_synonyms_and_filter() -> None:
    entries = topic_entries(
        {"retention.ms": "10"}, {"retention.ms": "20", "cleanup.policy": "compact"}, None, True
    )
    assert [e["name"] for e in entries] == sorted(TOPIC_CONFIG_KEYS)
    by_name = {e["name"]: e for e in entries}
    retention = by_name["retention.ms"]
    assert (retention["value"], retention["config_source"]) == ("10", SOURCE_TOPIC)
    assert retention["config_type"] == TYPE_LONG and retention["documentation"]
    assert not retention["read_only"] and not retention["is_sensitive"]
    assert retention["synonyms"] == [
        {"name": "retention.ms", "value": "10", "source": SOURCE_TOPIC},
        {"name": "log.retention.ms", "value": "20", "source": SOURCE_STATIC_BROKER},
        {"name": "log.retention.ms", "value": "604800000", "source": SOURCE_DEFAULT},
    ]
    policy = by_name["cleanup.policy"]
    assert (policy["value"], policy["config_source"]) == ("compact", SOURCE_STATIC_BROKER)
    assert policy["config_type"] == TYPE_LIST
    size = by_name["max.message.bytes"]
    assert (size["value"], size["config_source"], size["is_default"]) == (
        "1048588",
        SOURCE_DEFAULT,
        True,
    )
    assert size["synonyms"] == [
        {"name": "message.max.bytes", "value": "1048588", "source": SOURCE_DEFAULT}
    ]
    only = topic_entries({}, {}, {"segment.ms", "nope"}, False)
    assert [(e["name"], e["synonyms"]) for e in only] == [("segment.ms", [])]


def test_broker_entries_are_read_only_with_topic_defaults() -> None:
    entries = broker_entries(
        {"broker.id": ("3", 3), "log.segment.bytes": ("4096", 3)},
        {"retention.ms": "20"},
        None,
        False,
    )
    by_name = {e["name"]: e for e in entries}
    assert all(e["read_only"] for e in entries)
    assert by_name["broker.id"]["config_source"] == SOURCE_STATIC_BROKER
    assert by_name["log.segment.bytes"]["value"] == "4096"  # the broker's own value wins
    assert (by_name["log.retention.ms"]["value"], by_name["log.retention.ms"]["config_source"]) == (
        "20",
        SOURCE_STATIC_BROKER,
    )
    assert by_name["log.cleanup.policy"]["config_source"] == SOURCE_DEFAULT
    only = broker_entries({"broker.id": ("3", 3)}, {}, {"broker.id"}, True)
    assert [e["synonyms"] for e in only] == [
        [{"name": "broker.id", "value": "3", "source": SOURCE_STATIC_BROKER}]
    ]


def test_effective_config_follows_a_change() -> None:
    effective = EffectiveTopicConfig.from_explicit(
        incremental_topic_configs(
            {},
            [
                ("message.timestamp.type", OP_SET, "LogAppendTime"),
                ("cleanup.policy", OP_SET, "compact"),
                ("max.message.bytes", OP_SET, "2000"),
            ],
        )
    )
    assert effective.log_append_time and effective.compacted
    assert not effective.retention_deletes and effective.max_message_bytes == 2000


def test_create_topics_partition_and_factor_rules() -> None:
    assert partitions_error(-1, None) is None  # the broker default
    assert partitions_error(3, None) is None
    for bad in (0, -2, 100_000):
        assert partitions_error(bad, None) is not None
    assert partitions_error(-1, 0) is not None  # an empty assignment list
    assert partitions_error(-1, 4) is None
    assert replication_error(-1) is None and replication_error(3) is None
    assert "larger than 0" in (replication_error(0) or "")
    assert replication_error(4) is not None


def test_create_partitions_rules() -> None:
    assert create_partitions_error("t", 3, 5, None) is None
    assert create_partitions_error("t", None, 5, None) == (
        ErrorCode.unknown_topic_or_partition,
        "The topic 't' does not exist.",
    )
    assert create_partitions_error("t", 3, 3, None) == (
        ErrorCode.invalid_partitions,
        "Topic already has 3 partition(s).",
    )
    assert create_partitions_error("t", 3, 2, None) == (
        ErrorCode.invalid_partitions,
        "The topic t currently has 3 partition(s); 2 would not be an increase.",
    )
    error = create_partitions_error("t", 3, 6, 2)
    assert error is not None and error[0] == ErrorCode.invalid_replica_assignment
    assert create_partitions_error("t", 3, 6, 3) is None
    error = create_partitions_error("t", 3, 20_000, None)
    assert error is not None and error[0] == ErrorCode.invalid_partitions


def test_duplicate_checks_are_linear_in_the_request() -> None:
    """A request may carry hundreds of thousands of entries; the duplicate checks count them
    once (list.count per entry took minutes on the event loop)."""
    n = 200_000
    start = time.monotonic()
    replicas = [*range(n), 7]
    assert assignment_error([replicas], set(range(n))) == (
        "The manual partition assignment includes the broker 7 more than once."
    )
    entries: list[tuple[str, str | None]] = [("retention.ms", "1")] * 2 + [
        (f"k{i}", "v") for i in range(n)
    ]
    with pytest.raises(ConfigChangeError) as info:
        replace_topic_configs(entries)
    assert info.value.code == ErrorCode.invalid_request
    assert info.value.message == "Error due to duplicate config keys"
    assert time.monotonic() - start < 2.0


def test_cluster_doc_grows_a_topic_and_changes_its_configs() -> None:
    mains = [1, 2, 3]
    doc = ClusterDoc("c").with_topic("t", TOPIC_ID, 2, {"retention.ms": "5"}, mains)
    grown = doc.with_partitions("t", 5, mains)
    meta = grown.topics["t"]
    # The first partitions keep their leaders and epochs; all five are placed as a topic
    # created with five would have them.
    assert meta.leaders[:2] == doc.topics["t"].leaders
    assert list(meta.leaders) == place_partitions("t", 5, mains)
    assert meta.epochs == (0, 0, 0, 0, 0)
    assert grown.version == doc.version + 1
    with pytest.raises(ValueError):
        grown.with_partitions("t", 5, mains)
    with pytest.raises(UnknownTopic):
        grown.with_partitions("u", 5, mains)
    changed = grown.with_topic_configs("t", {"cleanup.policy": "compact"})
    assert changed.topics["t"].configs == {"cleanup.policy": "compact"}
    assert changed.topics["t"].leaders == meta.leaders
    with pytest.raises(UnknownTopic):
        changed.with_topic_configs("u", {})
    # The document's format is unchanged: the bytes round-trip.
    assert ClusterDoc.from_bytes(changed.to_bytes()) == changed
    # Preferred leaders: a main is taken, any other node id falls back to the placement.
    wished = doc.with_partitions("t", 4, mains, [3, 101])
    assert wished.topics["t"].leaders[2:] == (3, place_partitions("t", 4, mains)[3])
    # Grown by another client after the request was checked: the count it now has, so the
    # handler answers as Kafka would have with that count.
    for count, wish in ((5, None), (6, [1, 2, 3])):
        with pytest.raises(PartitionCountChanged) as changed_count:
            grown.with_partitions("t", count, mains, wish)
        assert changed_count.value.current == 5
    assert create_partitions_error("t", 5, 6, 3) == (
        ErrorCode.invalid_replica_assignment,
        "Attempted to add 1 additional partition(s), but only 3 assignment(s) were specified.",
    )


def test_manual_assignment_rules() -> None:
    known = {1, 2, 3, 101}
    assert assignment_error([[1], [2, 101]], known) is None
    assert "empty replica list" in (assignment_error([[1], []], known) or "")
    assert "broker 2 more than once" in (assignment_error([[2, 2]], known) or "")
    assert "not registered: [7, 9]" in (assignment_error([[1, 9, 7]], known) or "")
