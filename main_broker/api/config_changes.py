"""Topic config changes and descriptions as Kafka 4.x computes them: AlterConfigs (replace
the explicit set), IncrementalAlterConfigs (SET, DELETE, APPEND, SUBTRACT) and the entries of
DescribeConfigs with their sources and synonyms. Pure, no I/O (`main_broker.api.configs`
serves them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from main_broker.topic_config import (
    TOPIC_CONFIG_KEYS,
    InvalidConfig,
    validate_topic_configs,
)

__all__ = [
    "OP_APPEND",
    "OP_DELETE",
    "OP_SET",
    "OP_SUBTRACT",
    "SOURCE_DEFAULT",
    "SOURCE_STATIC_BROKER",
    "SOURCE_TOPIC",
    "ConfigChangeError",
    "broker_entries",
    "incremental_topic_configs",
    "replace_topic_configs",
    "topic_entries",
]

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_APPEND: "append", OP_SUBTRACT: "subtract"}

# DescribeConfigs config_source.
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class ConfigChangeError(Exception):
    """A change Kafka refuses: the error code and message of the resource's result."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _no_duplicates(names: Sequence[str]) -> None:
    if len(set(names)) != len(names):
        raise ConfigChangeError(ErrorCode.invalid_request, "Error due to duplicate config keys")


def _no_null_values(names: Sequence[str]) -> None:
    # AlterConfigs and IncrementalAlterConfigs (but DELETE) refuse a null value before they
    # look at the key (ConfigAdminManager.preprocess); CreateTopics' is INVALID_CONFIG.
    if names:
        raise ConfigChangeError(
            ErrorCode.invalid_request, f"Null value not supported for : {', '.join(names)}"
        )


def _validated(configs: Mapping[str, str | None]) -> dict[str, str]:
    try:
        return validate_topic_configs(configs)
    except InvalidConfig as exc:
        raise ConfigChangeError(ErrorCode.invalid_config, str(exc)) from None


def replace_topic_configs(
    entries: Sequence[tuple[str, str | None]], *, null_is_invalid_request: bool = False
) -> dict[str, str]:
    """AlterConfigs (`null_is_invalid_request`) and CreateTopics: the given entries become the
    topic's whole explicit set (others revert to their defaults)."""
    _no_duplicates([name for name, _ in entries])
    if null_is_invalid_request:
        _no_null_values([name for name, value in entries if value is None])
    return _validated(dict(entries))


def _list_value(current: Mapping[str, str], name: str) -> list[str]:
    raw = current.get(name, TOPIC_CONFIG_KEYS[name].default)
    return [p.strip() for p in raw.split(",") if p.strip()]


def incremental_topic_configs(
    current: Mapping[str, str], ops: Sequence[tuple[str, int, str | None]]
) -> dict[str, str]:
    """IncrementalAlterConfigs: the explicit set after applying (name, op, value) in order.
    APPEND and SUBTRACT work on list-typed keys only, starting from the explicit value or the
    key's default, as Kafka's ConfigAdminManager does."""
    _no_duplicates([name for name, _, _ in ops])
    _no_null_values([name for name, op, value in ops if op != OP_DELETE and value is None])
    result: dict[str, str | None] = dict(current)
    for name, op, value in ops:
        if op == OP_SET:
            result[name] = value
        elif op == OP_DELETE:
            result.pop(name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            key = TOPIC_CONFIG_KEYS.get(name)
            if key is None:
                raise ConfigChangeError(
                    ErrorCode.invalid_config, f"Unknown topic config name: {name}"
                )
            if not key.is_list:
                raise ConfigChangeError(
                    ErrorCode.invalid_config,
                    f"Config value {_OP_NAMES[op]} is not allowed for config key: {name}",
                )
            items = [p.strip() for p in (value or "").split(",") if p.strip()]
            old = _list_value(current, name)
            if op == OP_APPEND:
                new = old + [i for i in dict.fromkeys(items) if i not in old]
            else:
                new = [i for i in old if i not in items]
            result[name] = ",".join(new)
        else:
            raise ConfigChangeError(
                ErrorCode.invalid_request, f"Unknown alter config operation {op} for {name}"
            )
    return _validated(result)


def _entry(
    name: str,
    value: str | None,
    source: int,
    read_only: bool,
    config_type: int,
    doc: str | None,
    synonyms: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_default": source == SOURCE_DEFAULT,
        "is_sensitive": False,
        "synonyms": synonyms,
        "config_type": config_type,
        "documentation": doc,
    }


def topic_entries(
    explicit: Mapping[str, str],
    broker_defaults: Mapping[str, str],
    wanted: Collection[str] | None,
    include_synonyms: bool,
) -> list[dict[str, Any]]:
    """DescribeConfigs of a topic: every supported key (or those `wanted`), its value and
    where it comes from: the topic (TOPIC_CONFIG), the broker's static topic defaults
    (STATIC_BROKER_CONFIG, named by the broker key) or the built-in default (DEFAULT_CONFIG).
    Synonyms list every level that sets it, most specific first."""
    out = []
    for name in sorted(TOPIC_CONFIG_KEYS):
        if wanted is not None and name not in wanted:
            continue
        key = TOPIC_CONFIG_KEYS[name]
        broker_name = key.broker_key or name
        levels: list[tuple[str, str, int]] = []
        if name in explicit:
            levels.append((name, explicit[name], SOURCE_TOPIC))
        if name in broker_defaults:
            levels.append((broker_name, broker_defaults[name], SOURCE_STATIC_BROKER))
        levels.append((broker_name, key.default, SOURCE_DEFAULT))
        _, value, source = levels[0]
        synonyms = [{"name": n, "value": v, "source": s} for n, v, s in levels]
        out.append(
            _entry(
                name,
                value,
                source,
                False,
                key.config_type,
                key.doc,
                synonyms if include_synonyms else [],
            )
        )
    return out


def broker_entries(
    static: Mapping[str, tuple[str, int]],
    broker_defaults: Mapping[str, str],
    wanted: Collection[str] | None,
    include_synonyms: bool,
) -> list[dict[str, Any]]:
    """DescribeConfigs of a broker: its static settings and the broker-level defaults of the
    topic keys. All are read-only here: a broker's configs change only with its TOML file.
    `static` maps a name to its value and DescribeConfigs type."""
    rows: dict[str, tuple[str, int, int, str | None]] = {
        name: (value, SOURCE_STATIC_BROKER, config_type, None)
        for name, (value, config_type) in static.items()
    }
    for key in TOPIC_CONFIG_KEYS.values():
        broker_name = key.broker_key
        if broker_name is None or broker_name in rows:
            continue  # a topic key with no broker-level synonym (Kafka's throttled replicas)
        name = key.name
        if name in broker_defaults:
            rows[broker_name] = (
                broker_defaults[name],
                SOURCE_STATIC_BROKER,
                key.config_type,
                key.doc,
            )
        else:
            rows[broker_name] = (key.default, SOURCE_DEFAULT, key.config_type, key.doc)
    out = []
    for name in sorted(rows):
        if wanted is not None and name not in wanted:
            continue
        value, source, config_type, doc = rows[name]
        synonyms = [{"name": name, "value": value, "source": source}] if include_synonyms else []
        out.append(_entry(name, value, source, True, config_type, doc, synonyms))
    return out
