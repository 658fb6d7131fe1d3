"""What a zone proxy does with a relayed request once its ACL checks ran: a `Verdict`.

Kafka's handlers answer most requests per resource: a denied topic, group or transactional
id gets its *_AUTHORIZATION_FAILED entry and the others are served. A proxy does the same
without a main learning of the denied part: it relays only the allowed part of the request
(`Verdict.request`) and joins the denied part into the main's answer (`Verdict.complete`),
which is also where answers are filtered (ListGroups, ListTransactions, all-topics Metadata)
and `authorized_operations` set for the principal. A request with nothing allowed is
answered in the proxy (`Verdict.answer`); one wholly allowed, with an answer to keep as it
is, has no verdict (None) and is relayed as it came.

`Caller` is the principal of one request as the per-API checks (proxy_broker/access_*.py)
see it: each decision is asked once per resource and audited under the request's API name,
as Kafka's AuthHelper.filterByAuthorized logs one line per resource.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from kafka_wire.acl import CLUSTER_NAME, Operation, ResourceType
from kafka_wire.codec import RequestHeader
from kafka_wire.errors import ErrorCode
from kafka_wire.server_loop import ConnectionInfo, api_name

if TYPE_CHECKING:
    from proxy_broker.access import ProxyAccess

__all__ = [
    "MESSAGES",
    "Caller",
    "Check",
    "Complete",
    "Data",
    "NoTopics",
    "NotAuthorized",
    "TopicIndex",
    "Verdict",
    "answer",
    "partition_errors",
    "relay",
    "relay_part",
    "split_topics",
]

Data = dict[str, Any]
Complete = Callable[[Data], Data]

TOPIC, GROUP, CLUSTER, TXN = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
TAF: Final = ErrorCode.topic_authorization_failed
GAF: Final = ErrorCode.group_authorization_failed
CAF: Final = ErrorCode.cluster_authorization_failed
TIAF: Final = ErrorCode.transactional_id_authorization_failed
#: Kafka's default message of each code (Errors.message), where its answers carry one.
MESSAGES: Final[dict[ErrorCode, str]] = {
    TAF: "Topic authorization failed.",
    GAF: "Group authorization failed.",
    CAF: "Cluster authorization failed.",
    TIAF: "Transactional Id authorization failed.",
}


class NotAuthorized(Exception):
    """A request the principal may not make that has no answer but a closed connection: an
    API only super users may use, or one whose allowed part cannot be relayed."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """At most one of `answer` and `request` is set; `complete` only with a relay."""

    answer: Data | None = None  # answered in the proxy with this response; nothing relayed
    request: Data | None = None  # relayed instead of the client's request: its allowed part
    complete: Complete | None = None  # the main's answer -> the client's


def answer(data: Data) -> Verdict:
    return Verdict(answer=data)


def relay(request: Data | None = None, complete: Complete | None = None) -> Verdict | None:
    if request is None and complete is None:
        return None
    return Verdict(request=request, complete=complete)


class TopicIndex(Protocol):
    """The topics the proxy's mirrors hold: names for ids, and whether a name exists."""

    def topic_name(self, topic_id: uuid.UUID) -> str | None: ...

    def topic_exists(self, name: str) -> bool: ...


class NoTopics:
    """An index that knows no topic (tests of requests that name topics by name)."""

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return None

    def topic_exists(self, name: str) -> bool:
        return False


@dataclass(slots=True)
class Caller:
    access: ProxyAccess
    conn: ConnectionInfo
    header: RequestHeader
    topics: TopicIndex = field(default_factory=NoTopics)
    _decided: dict[tuple[int, int, str], bool] = field(default_factory=dict)
    _audited: set[tuple[int, int, str]] = field(default_factory=set)

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def api(self) -> str:
        return api_name(self.header.api_key)

    def may(self, operation: Operation, rtype: int, name: str, *, audit: bool = True) -> bool:
        """Whether the principal may; a denial is audited once per request and resource
        unless `audit` is False (where Kafka passes logIfDenied = false)."""
        key = (int(operation), rtype, name)
        allowed = self._decided.get(key)
        if allowed is None:
            allowed = self._decided[key] = self.access.allows(
                self.conn, operation, rtype, name, audit=False
            )
        if not allowed and audit and key not in self._audited:
            self._audited.add(key)
            self.access.denied(self.conn, operation, rtype, name, self.api)
        return allowed

    def may_cluster(self, operation: Operation, *, audit: bool = True) -> bool:
        return self.may(operation, CLUSTER, CLUSTER_NAME, audit=audit)

    def operations(self, rtype: ResourceType, name: str) -> int:
        """The authorized-operations bit field of the resource for this principal."""
        return self.access.authorized_operations(self.conn, rtype, name)

    def topic(self, entry: Data) -> str | None:
        """The name of a topic entry given by name or by id; None for an id no mirror knows
        (answered UNKNOWN_TOPIC_ID: a name that was never checked is never relayed)."""
        name = entry.get("name")
        if name:
            return str(name)
        topic_id = entry.get("topic_id")
        if isinstance(topic_id, uuid.UUID) and topic_id.int:
            return self.topics.topic_name(topic_id)
        return str(name or "")


#: The checks of one API: what to do with its request, or None (relay it as it came).
Check = Callable[[Caller, Any], "Verdict | None"]


def split_topics(
    caller: Caller, topics: Iterable[Data], operation: Operation
) -> tuple[list[Data], list[tuple[Data, ErrorCode]]]:
    """The topic entries the principal may `operation`, and the others with their code."""
    allowed: list[Data] = []
    refused: list[tuple[Data, ErrorCode]] = []
    for topic in topics:
        name = caller.topic(topic)
        if name is None:
            refused.append((topic, ErrorCode.unknown_topic_id))
        elif caller.may(operation, TOPIC, name):
            allowed.append(topic)
        else:
            refused.append((topic, TAF))
    return allowed, refused


def partition_errors(
    topic: Data, code: ErrorCode, partitions: str = "partitions", **fields: Any
) -> Data:
    """A topic's answer with every partition the request named failed with `code`; the
    topic keeps how the request named it (name or id). `partitions`: the request's field,
    of entries with a partition_index or of bare indexes."""
    out: Data = {k: topic[k] for k in ("name", "topic_id") if k in topic}
    indexes = [p if isinstance(p, int) else p["partition_index"] for p in topic[partitions] or ()]
    out["partitions"] = [{"partition_index": i, "error_code": code, **fields} for i in indexes]
    return out


def relay_part(
    request: Data,
    allowed: list[Any],
    refused: list[Data],
    *,
    field: str = "topics",
    results: str | None = None,
    base: Data | None = None,
) -> Verdict | None:
    """A request answered per resource: the `allowed` entries of its `field` relayed and
    the `refused` answers joined to the main's `results` (by default the same name);
    answered in the proxy (`base` plus them) when none is allowed."""
    out_field = results or field
    if not refused:
        return None
    if not allowed:
        return answer({**(base or {}), out_field: refused})
    return Verdict(
        request={**request, field: allowed},
        complete=lambda out: {**out, out_field: [*out[out_field], *refused]},
    )
