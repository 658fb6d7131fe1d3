"""Topic-level configuration: the keys we support, their defaults and their validation."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

LONG_MAX = 2**63 - 1


class InvalidConfig(ValueError):
    pass


def _integer(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidConfig(f"{value!r} is not an integer") from None


def _int_at_least(minimum: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        number = _integer(value)
        if number < minimum:
            raise InvalidConfig(f"{value} is below the minimum {minimum}")
        return str(number)

    return check


def _long(value: str) -> str:
    return str(_integer(value))


def _int_between(low: int, high: int, *also: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        number = _integer(value)
        if not (low <= number <= high or number in also):
            extra = "".join(f" or {a}" for a in also)
            raise InvalidConfig(f"{value} is not between {low} and {high}{extra}")
        return str(number)

    return check


def _double_between(low: float, high: float) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = float(value.strip())
        except ValueError:
            raise InvalidConfig(f"{value!r} is not a number") from None
        if not low <= number <= high:
            raise InvalidConfig(f"{value} is not between {low} and {high}")
        return str(number)

    return check


def _one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise InvalidConfig(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return check


def _cleanup_policy(value: str) -> str:
    # Kafka's ValidList.in(compact, delete): an empty list is valid (nothing is ever deleted
    # or compacted: the data is kept forever).
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if any(p not in ("delete", "compact") for p in parts):
        raise InvalidConfig(f"{value!r} is not a list of delete, compact")
    return ",".join(parts)


def _boolean(value: str) -> str:
    if value.strip().lower() not in ("true", "false"):
        raise InvalidConfig(f"{value!r} is not true or false")
    return value.strip().lower()


# Kafka's MetadataVersionValidator: a release ("2.8", "3.0.1") or one with its IV ("3.0-IV1").
_METADATA_VERSION = re.compile(r"^(0\.(8|9|10|11)|[1-4]\.\d+)(\.\d+)?(-IV\d+)?$")


def _metadata_version(value: str) -> str:
    if not _METADATA_VERSION.match(value.strip()):
        raise InvalidConfig(f"{value!r} is not a valid version (such as 3.0-IV1)")
    return value.strip()


_THROTTLED_ENTRY = re.compile(r"^\d+:\d+$")


def _throttled_replicas(value: str) -> str:
    # Kafka's ThrottledReplicaListValidator: "*" or partition:broker pairs.
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if parts == ["*"] or all(_THROTTLED_ENTRY.match(p) for p in parts):
        return ",".join(parts)
    raise InvalidConfig(
        f"{value!r} must be the literal '*' or a list of replicas in the format "
        "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
    )


# DescribeConfigs config_type (v3+), as Kafka's ConfigDef.Type.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_SHORT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
)

NO_EFFECT = "Stored and described; no effect in zonefleet: "


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    default: str
    validate: Callable[[str], str]
    doc: str
    config_type: int = TYPE_STRING
    # The broker-level key whose value is this topic key's default (Kafka's synonym).
    broker_key: str | None = None

    @property
    def is_list(self) -> bool:
        return self.config_type == TYPE_LIST


# Every topic config of Kafka 3.9/4.x's LogConfig, with its type, default and valid range.
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in (
        ConfigKey(
            "cleanup.policy",
            "delete",
            _cleanup_policy,
            "delete (retention drops old data) and/or compact (keyed records; null keys "
            "refused); empty: neither, the data is kept forever",
            TYPE_LIST,
            "log.cleanup.policy",
        ),
        ConfigKey(
            "retention.ms",
            "604800000",
            _int_at_least(-1),
            "how long data is kept in the object tier; -1 = forever",
            TYPE_LONG,
            "log.retention.ms",
        ),
        ConfigKey(
            "retention.bytes",
            "-1",
            _long,
            "bytes kept per partition before the oldest objects go; -1 = no limit",
            TYPE_LONG,
            "log.retention.bytes",
        ),
        ConfigKey(
            "max.message.bytes",
            "1048588",
            _int_at_least(0),
            "the largest record batch a produce may carry",
            TYPE_INT,
            "message.max.bytes",
        ),
        ConfigKey(
            "message.timestamp.type",
            "CreateTime",
            _one_of("CreateTime", "LogAppendTime"),
            "whose timestamp the records carry: the producer's or the broker's append time",
            TYPE_STRING,
            "log.message.timestamp.type",
        ),
        ConfigKey(
            "message.timestamp.before.max.ms",
            str(LONG_MAX),
            _int_at_least(0),
            "how far in the past a CreateTime timestamp may be",
            TYPE_LONG,
            "log.message.timestamp.before.max.ms",
        ),
        ConfigKey(
            "message.timestamp.after.max.ms",
            "3600000",
            _int_at_least(0),
            "how far in the future a CreateTime timestamp may be",
            TYPE_LONG,
            "log.message.timestamp.after.max.ms",
        ),
        ConfigKey(
            "message.timestamp.difference.max.ms",
            str(LONG_MAX),
            _int_at_least(0),
            NO_EFFECT + "deprecated in Kafka (removed in 4.0); use "
            "message.timestamp.before.max.ms and message.timestamp.after.max.ms",
            TYPE_LONG,
            "log.message.timestamp.difference.max.ms",
        ),
        ConfigKey(
            "delete.retention.ms",
            "86400000",
            _int_at_least(0),
            "how long the log cleaner keeps tombstones (null values) of a compacted topic",
            TYPE_LONG,
            "log.cleaner.delete.retention.ms",
        ),
        ConfigKey(
            "min.compaction.lag.ms",
            "0",
            _int_at_least(0),
            "the minimum time a record stays uncompacted in a compacted topic",
            TYPE_LONG,
            "log.cleaner.min.compaction.lag.ms",
        ),
        ConfigKey(
            "max.compaction.lag.ms",
            str(LONG_MAX),
            _int_at_least(1),
            "the maximum time a record stays ineligible for compaction",
            TYPE_LONG,
            "log.cleaner.max.compaction.lag.ms",
        ),
        ConfigKey(
            "min.cleanable.dirty.ratio",
            "0.5",
            _double_between(0.0, 1.0),
            "how dirty (uncleaned bytes over all bytes) a compacted log must be to be cleaned",
            TYPE_DOUBLE,
            "log.cleaner.min.cleanable.ratio",
        ),
        ConfigKey(
            "file.delete.delay.ms",
            "60000",
            _int_at_least(0),
            NO_EFFECT + "objects are retired by the object tier's own schedule",
            TYPE_LONG,
            "log.segment.delete.delay.ms",
        ),
        ConfigKey(
            "segment.bytes",
            "1073741824",
            _int_at_least(14),
            NO_EFFECT + "the WAL and the object tier have their own sizes",
            TYPE_INT,
            "log.segment.bytes",
        ),
        ConfigKey(
            "segment.ms",
            "604800000",
            _int_at_least(1),
            NO_EFFECT + "the WAL and the object tier have their own sizes",
            TYPE_LONG,
            "log.roll.ms",
        ),
        ConfigKey(
            "segment.jitter.ms",
            "0",
            _int_at_least(0),
            NO_EFFECT + "there are no log segments to roll",
            TYPE_LONG,
            "log.roll.jitter.ms",
        ),
        ConfigKey(
            "segment.index.bytes",
            "10485760",
            _int_at_least(4),
            NO_EFFECT + "objects carry their own index",
            TYPE_INT,
            "log.index.size.max.bytes",
        ),
        ConfigKey(
            "index.interval.bytes",
            "4096",
            _int_at_least(0),
            NO_EFFECT + "objects carry their own index",
            TYPE_INT,
            "log.index.interval.bytes",
        ),
        ConfigKey(
            "flush.messages",
            str(LONG_MAX),
            _int_at_least(1),
            NO_EFFECT + "every acknowledged write is already fsynced to the WAL",
            TYPE_LONG,
            "log.flush.interval.messages",
        ),
        ConfigKey(
            "flush.ms",
            str(LONG_MAX),
            _int_at_least(0),
            NO_EFFECT + "every acknowledged write is already fsynced to the WAL",
            TYPE_LONG,
            "log.flush.interval.ms",
        ),
        ConfigKey(
            "preallocate",
            "false",
            _boolean,
            NO_EFFECT + "there are no log segment files",
            TYPE_BOOLEAN,
            "log.preallocate",
        ),
        ConfigKey(
            "min.insync.replicas",
            "1",
            _int_at_least(1),
            NO_EFFECT + "the WAL fsync on shared storage is the quorum",
            TYPE_INT,
            "min.insync.replicas",
        ),
        ConfigKey(
            "compression.type",
            "producer",
            _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            NO_EFFECT + "batches are stored as the producer compressed them",
            TYPE_STRING,
            "compression.type",
        ),
        ConfigKey(
            "compression.gzip.level",
            "-1",
            _int_between(1, 9, -1),
            NO_EFFECT + "batches are never recompressed",
            TYPE_INT,
            "compression.gzip.level",
        ),
        ConfigKey(
            "compression.lz4.level",
            "9",
            _int_between(1, 17),
            NO_EFFECT + "batches are never recompressed",
            TYPE_INT,
            "compression.lz4.level",
        ),
        ConfigKey(
            "compression.zstd.level",
            "3",
            _int_between(-131072, 22),
            NO_EFFECT + "batches are never recompressed",
            TYPE_INT,
            "compression.zstd.level",
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            "false",
            _boolean,
            NO_EFFECT + "storage is shared, every leader is clean",
            TYPE_BOOLEAN,
            "unclean.leader.election.enable",
        ),
        ConfigKey(
            "message.format.version",
            "3.0-IV1",
            _metadata_version,
            NO_EFFECT + "deprecated in Kafka (removed in 4.0); batches are always magic v2",
            TYPE_STRING,
            "log.message.format.version",
        ),
        ConfigKey(
            "message.downconversion.enable",
            "true",
            _boolean,
            NO_EFFECT + "deprecated in Kafka (removed in 4.0); no fetch version needs "
            "down-conversion",
            TYPE_BOOLEAN,
            "log.message.downconversion.enable",
        ),
        ConfigKey(
            "leader.replication.throttled.replicas",
            "",
            _throttled_replicas,
            NO_EFFECT + "there is no follower replication to throttle",
            TYPE_LIST,
        ),
        ConfigKey(
            "follower.replication.throttled.replicas",
            "",
            _throttled_replicas,
            NO_EFFECT + "there is no follower replication to throttle",
            TYPE_LIST,
        ),
        ConfigKey(
            "remote.storage.enable",
            "false",
            _boolean,
            NO_EFFECT + "all data goes to the object tier anyway",
            TYPE_BOOLEAN,
        ),
        ConfigKey(
            "local.retention.ms",
            "-2",
            _int_at_least(-2),
            NO_EFFECT + "there is no local log tier (-2: as retention.ms)",
            TYPE_LONG,
            "log.local.retention.ms",
        ),
        ConfigKey(
            "local.retention.bytes",
            "-2",
            _int_at_least(-2),
            NO_EFFECT + "there is no local log tier (-2: as retention.bytes)",
            TYPE_LONG,
            "log.local.retention.bytes",
        ),
        ConfigKey(
            "remote.log.copy.disable",
            "false",
            _boolean,
            NO_EFFECT + "all data goes to the object tier anyway",
            TYPE_BOOLEAN,
        ),
        ConfigKey(
            "remote.log.delete.on.disable",
            "false",
            _boolean,
            NO_EFFECT + "all data goes to the object tier anyway",
            TYPE_BOOLEAN,
        ),
    )
}


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Normalised explicit configs; raises InvalidConfig naming the bad key."""
    result: dict[str, str] = {}
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise InvalidConfig(f"Unknown topic config name: {name}")
        if value is None:
            raise InvalidConfig(f"Null value not supported for topic config {name}")
        try:
            result[name] = key.validate(value)
        except InvalidConfig as exc:
            raise InvalidConfig(f"Invalid value for {name}: {exc}") from None
    # LogConfig.validateValues: the compaction lags must be ordered.
    min_lag = int(
        result.get("min.compaction.lag.ms", TOPIC_CONFIG_KEYS["min.compaction.lag.ms"].default)
    )
    max_lag = int(
        result.get("max.compaction.lag.ms", TOPIC_CONFIG_KEYS["max.compaction.lag.ms"].default)
    )
    if min_lag > max_lag:
        raise InvalidConfig(
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})"
        )
    return result


@dataclass(frozen=True, slots=True)
class EffectiveTopicConfig:
    """The values the append and retention paths read, parsed once per change."""

    log_append_time: bool
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    max_message_bytes: int
    retention_ms: int
    retention_bytes: int
    compacted: bool
    retention_deletes: bool = True  # cleanup.policy has "delete": retention.ms/bytes apply
    # The log cleaner's settings (cleanup.policy has "compact").
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86400000

    @classmethod
    def from_explicit(
        cls, explicit: Mapping[str, str], defaults: Mapping[str, str] | None = None
    ) -> EffectiveTopicConfig:
        def value(name: str) -> str:
            if name in explicit:
                return explicit[name]
            if defaults and name in defaults:
                return defaults[name]
            return TOPIC_CONFIG_KEYS[name].default

        return cls(
            log_append_time=value("message.timestamp.type") == "LogAppendTime",
            timestamp_before_max_ms=int(value("message.timestamp.before.max.ms")),
            timestamp_after_max_ms=int(value("message.timestamp.after.max.ms")),
            max_message_bytes=int(value("max.message.bytes")),
            retention_ms=int(value("retention.ms")),
            retention_bytes=int(value("retention.bytes")),
            compacted="compact" in value("cleanup.policy"),
            retention_deletes="delete" in value("cleanup.policy"),
            min_cleanable_dirty_ratio=float(value("min.cleanable.dirty.ratio")),
            min_compaction_lag_ms=int(value("min.compaction.lag.ms")),
            max_compaction_lag_ms=int(value("max.compaction.lag.ms")),
            delete_retention_ms=int(value("delete.retention.ms")),
        )
