"""The cluster's small documents (access lists, SCRAM credentials, client quotas): their
bytes and their changes.

Pure data, read by mains and zone proxies; `main_broker.security.doc_store` keeps them
durable (object store by compare-and-swap with several mains, the WAL for a lone main).
UTF-8 JSON without spaces (docs/formats.md, "ACL, SCRAM and quota documents"):

    acls.json:  {"format": 1, "version": int,
                 "acls": [[resource type, name, pattern type, principal, host, operation,
                           permission], ...]}                          # sorted, no duplicates
    scram.json: {"format": 1, "version": int,
                 "users": {user: {mechanism name: {"salt": b64, "stored_key": b64,
                                                   "server_key": b64, "iterations": int}}}}
    quotas.json: {"format": 1, "version": int,
                  "quotas": [[{entity type: name or null}, {quota key: number}], ...]}
                                          # sorted by entity; null is the <default> entry
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka_wire.acl.rules import AclBinding
from kafka_wire.quotas.entities import QuotaEntity, Quotas
from kafka_wire.sasl.scram import MECHANISMS, ScramCredential

__all__ = [
    "ACLS_DOC",
    "DOC_PREFIX",
    "QUOTAS_DOC",
    "SCRAM_DOC",
    "AclsDoc",
    "QuotasDoc",
    "ScramDoc",
    "SecurityDocError",
    "doc_key",
]

FORMAT = 1
ACLS_DOC = "acls"
SCRAM_DOC = "scram"
QUOTAS_DOC = "quotas"
DOC_PREFIX = "cluster/"  # with a metadata store, each document is the object cluster/<name>.json
_MECHANISM_TYPES = {name: code for code, (name, _) in MECHANISMS.items()}


class SecurityDocError(ValueError):
    pass


def doc_key(name: str, prefix: str = DOC_PREFIX) -> str:
    """The object key of document `name` in the cluster metadata store."""
    return f"{prefix}{name}.json"


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise SecurityDocError(f"{what} document is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SecurityDocError(f"not a format-{FORMAT} {what} document")
    if not isinstance(raw.get("version"), int):
        raise SecurityDocError(f"{what} document has no integer version")
    return raw


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class AclsDoc:
    version: int = 0
    acls: frozenset[AclBinding] = frozenset()

    def to_bytes(self) -> bytes:
        rows = [
            [
                b.resource_type,
                b.name,
                b.pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission,
            ]
            for b in sorted(self.acls)
        ]
        return _dump({"format": FORMAT, "version": self.version, "acls": rows})

    @classmethod
    def from_bytes(cls, data: bytes) -> AclsDoc:
        raw = _load(data, "ACL")
        try:
            acls = frozenset(_binding(row) for row in raw["acls"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SecurityDocError(f"corrupt ACL document: {exc!r}") from None
        return cls(raw["version"], acls)

    def with_acls(self, added: Iterable[AclBinding]) -> AclsDoc:
        new = self.acls | frozenset(added)
        return self if new == self.acls else AclsDoc(self.version + 1, new)

    def without_acls(self, removed: Iterable[AclBinding]) -> AclsDoc:
        new = self.acls - frozenset(removed)
        return self if new == self.acls else AclsDoc(self.version + 1, new)


def _binding(row: Any) -> AclBinding:
    rt, name, pt, principal, host, op, perm = row
    ints, strs = (rt, pt, op, perm), (name, principal, host)
    if not all(type(x) is int for x in ints) or not all(isinstance(x, str) for x in strs):
        raise ValueError(f"bad ACL row {row!r}")
    return AclBinding(rt, name, pt, principal, host, op, perm)


@dataclass(frozen=True)
class ScramDoc:
    version: int = 0
    credentials: dict[tuple[str, int], ScramCredential] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        users: dict[str, dict[str, Any]] = {}
        for (user, mech), c in sorted(self.credentials.items()):
            users.setdefault(user, {})[MECHANISMS[mech][0]] = {
                "salt": _b64(c.salt),
                "stored_key": _b64(c.stored_key),
                "server_key": _b64(c.server_key),
                "iterations": c.iterations,
            }
        return _dump({"format": FORMAT, "version": self.version, "users": users})

    @classmethod
    def from_bytes(cls, data: bytes) -> ScramDoc:
        raw = _load(data, "SCRAM")
        creds: dict[tuple[str, int], ScramCredential] = {}
        try:
            for user, mechs in raw["users"].items():
                for mech_name, c in mechs.items():
                    if type(c["iterations"]) is not int:
                        raise ValueError(f"iterations of {user!r} is not an integer")
                    creds[(user, _MECHANISM_TYPES[mech_name])] = ScramCredential(
                        _unb64(c["salt"]),
                        _unb64(c["stored_key"]),
                        _unb64(c["server_key"]),
                        c["iterations"],
                    )
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise SecurityDocError(f"corrupt SCRAM document: {exc!r}") from None
        return cls(raw["version"], creds)

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """`user`'s credential for a mechanism named as SASL names it (SCRAM-SHA-256)."""
        code = _MECHANISM_TYPES.get(mechanism)
        return None if code is None else self.credentials.get((user, code))

    def with_credentials(self, credentials: dict[tuple[str, int], ScramCredential]) -> ScramDoc:
        if credentials == self.credentials:
            return self
        return ScramDoc(self.version + 1, dict(credentials))


@dataclass(frozen=True)
class QuotasDoc:
    """The client quotas AlterClientQuotas set (`kafka_wire.quotas`): entity -> key -> value."""

    version: int = 0
    quotas: dict[QuotaEntity, dict[str, float]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        rows = sorted(
            (
                [entity.to_kafka(), {k: _number(v) for k, v in sorted(values.items())}]
                for entity, values in self.quotas.items()
            ),
            key=lambda row: json.dumps(row[0]),
        )
        return _dump({"format": FORMAT, "version": self.version, "quotas": rows})

    @classmethod
    def from_bytes(cls, data: bytes) -> QuotasDoc:
        raw = _load(data, "quotas")
        quotas: dict[QuotaEntity, dict[str, float]] = {}
        try:
            if not isinstance(raw["quotas"], list):
                raise TypeError("quotas is not a list")
            for entries, values in raw["quotas"]:
                if not all(isinstance(n, str) or n is None for n in entries.values()):
                    raise ValueError(f"bad entity {entries!r}")
                entity = QuotaEntity.from_kafka(entries)
                if entity in quotas:
                    raise ValueError(f"entity {entity} listed twice")
                checked: dict[str, float] = {}
                for key, value in values.items():
                    if type(value) not in (int, float) or not value > 0:
                        raise ValueError(f"quota {key} of {entity} is {value!r}")
                    checked[str(key)] = float(value)
                quotas[entity] = checked
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SecurityDocError(f"corrupt quotas document: {exc!r}") from None
        return cls(raw["version"], quotas)

    @classmethod
    def parse(cls, data: bytes | None) -> QuotasDoc:
        """The document in these bytes; no document (None) is no quotas."""
        return cls() if data is None else cls.from_bytes(data)

    def with_quotas(self, quotas: Quotas) -> QuotasDoc:
        new = {entity: dict(values) for entity, values in quotas.items() if values}
        if new == self.quotas:
            return self
        return QuotasDoc(self.version + 1, new)


def _number(value: float) -> float | int:
    """A whole number without its ".0", so a value reads back and writes out the same bytes."""
    return int(value) if float(value).is_integer() else float(value)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not base64 text")
    return base64.b64decode(text, validate=True)
