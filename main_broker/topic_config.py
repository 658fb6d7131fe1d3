"""Topic-level configuration: the keys we support, their defaults and their validation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

LONG_MAX = 2**63 - 1


class InvalidConfig(ValueError):
    pass


def _int_at_least(minimum: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = int(value)
        except ValueError:
            raise InvalidConfig(f"{value!r} is not an integer") from None
        if number < minimum:
            raise InvalidConfig(f"{value} is below the minimum {minimum}")
        return str(number)

    return check


def _one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise InvalidConfig(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return check


def _cleanup_policy(value: str) -> str:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise InvalidConfig(f"{value!r} is not a list of delete, compact")
    return ",".join(parts)


def _boolean(value: str) -> str:
    if value.lower() not in ("true", "false"):
        raise InvalidConfig(f"{value!r} is not true or false")
    return value.lower()


# DescribeConfigs config_type (v3+), as Kafka's ConfigDef.Type.
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST = 1, 2, 3, 5, 7


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


TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in (
        ConfigKey(
            "cleanup.policy",
            "delete",
            _cleanup_policy,
            "delete (retention drops old data) and/or compact (keyed records; null keys refused)",
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
            _int_at_least(-1),
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
            "segment.bytes",
            "1073741824",
            _int_at_least(14),
            "kept for compatibility: the WAL and the object tier have their own sizes",
            TYPE_INT,
            "log.segment.bytes",
        ),
        ConfigKey(
            "segment.ms",
            "604800000",
            _int_at_least(1),
            "kept for compatibility: the WAL and the object tier have their own sizes",
            TYPE_LONG,
            "log.roll.ms",
        ),
        ConfigKey(
            "min.insync.replicas",
            "1",
            _int_at_least(1),
            "no effect: the WAL fsync on shared storage is the quorum",
            TYPE_INT,
            "min.insync.replicas",
        ),
        ConfigKey(
            "compression.type",
            "producer",
            _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            "batches are stored as the producer compressed them",
            TYPE_STRING,
            "compression.type",
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            "false",
            _boolean,
            "no effect: storage is shared",
            TYPE_BOOLEAN,
            "unclean.leader.election.enable",
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
        )
