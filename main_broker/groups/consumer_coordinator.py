"""The KIP-848 consumer group coordinator: ConsumerGroupHeartbeat and ConsumerGroupDescribe
for every consumer group this broker coordinates, with session and revocation timers.

The group logic is ``consumer_group.ConsumerGroup`` (pure); this module maps requests to it,
translates topic ids, and fires its deadlines on the trio clock. Groups are recorded on the
WAL (``consumer_persistence``): after a restart members carry on with their epochs and
partitions.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.acl.rules import ResourceType, authorized_operations
from main_broker.group_config import GroupConfig
from main_broker.groups.consumer_assignor import Assignment
from main_broker.groups.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    HeartbeatInput,
)
from main_broker.groups.consumer_persistence import ConsumerGroupLog, NoConsumerGroupLog

log = logging.getLogger(__name__)

NONE = int(ErrorCode.none)
INVALID_GROUP_ID = int(ErrorCode.invalid_group_id)
NOT_COORDINATOR = int(ErrorCode.not_coordinator)
GROUP_ID_NOT_FOUND = int(ErrorCode.group_id_not_found)
INVALID_REQUEST = int(ErrorCode.invalid_request)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)
MEMBER_TYPE_CONSUMER = 1
RESTART_MARGIN_S = 1.0


class TopicCatalog(Protocol):
    """The topics the cluster has, as the coordinator needs them."""

    def topic_partition_counts(self) -> Mapping[str, int]: ...

    def topic_id(self, name: str) -> uuid.UUID | None: ...

    def topic_name(self, topic_id: uuid.UUID) -> str | None: ...


class ConsumerCoordinator:
    def __init__(self, config: GroupConfig, topics: TopicCatalog) -> None:
        self.config = config
        self.topics = topics
        self.groups: dict[str, ConsumerGroup] = {}
        self.owns: Callable[[str], bool] = lambda group_id: True
        # A classic group with members holds the id (the classic coordinator answers this).
        self.classic_in_use: Callable[[str], bool] = lambda group_id: False
        # A new consumer group takes over the id from an empty classic group (its offsets stay).
        self.drop_classic: Callable[[str], None] = lambda group_id: None
        self._wakeup = trio.Event()
        self._next_wake = -math.inf
        self._hold_until = -math.inf
        self._empty_since: dict[str, float] = {}
        # Whether a group has committed offsets (an empty one with offsets is kept).
        self.has_offsets: Callable[[str], bool] = lambda group_id: False
        # Where groups are made durable (main_broker.groups.consumer_persistence).
        self.records: ConsumerGroupLog = NoConsumerGroupLog()

    # ------------------------------------------------------------------ timers
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.topics.topic_partition_counts():
            # A restart (a fresh cluster has no topics yet). The groups restored from the WAL
            # need no hold: every assignment a member was told is in a durable record. A group
            # that was not restored may still have members reading (its records predate this
            # version, or it was coordinated elsewhere when the mains changed): they keep
            # reading until a heartbeat tells them they are unknown or, unable to heartbeat,
            # their session runs out; until then such new groups hand out no partitions, or
            # two members could read one partition at once.
            session_s = self.config.consumer_session_timeout_ms / 1000
            self._hold_until = trio.current_time() + session_s + RESTART_MARGIN_S
        task_status.started()
        while True:
            now = trio.current_time()
            for group in list(self.groups.values()):
                if group.next_deadline() <= now:
                    gone = group.expire(now, self.topics.topic_partition_counts())
                    if gone:
                        log.info("consumer group %s: members %s expired", group.group_id, gone)
                        self.records.changed(group)
                self._note_empty(group, now)
            self._next_wake = min(
                (self._deadline(g) for g in self.groups.values()), default=math.inf
            )
            self._wakeup = trio.Event()
            with trio.move_on_at(self._next_wake):
                await self._wakeup.wait()

    def renew_sessions(self, now: float) -> None:
        """Starts every member's session again at `now`, the moment the main serves clients
        after a restart (as `GroupCoordinator.renew_sessions` for classic groups): restored
        members could not heartbeat while it was starting. A later deadline is kept."""
        for group in self.groups.values():
            for m in group.members.values():
                m.session_deadline = max(m.session_deadline, now + group.session_timeout_s)

    def _note_empty(self, group: ConsumerGroup, now: float) -> None:
        """An empty group without offsets is forgotten after empty_group_retention_ms."""
        gid = group.group_id
        if group.members:
            self._empty_since.pop(gid, None)
            return
        since = self._empty_since.setdefault(gid, now)
        if now - since >= self.config.empty_group_retention_ms / 1000:
            del self._empty_since[gid]
            if not self.has_offsets(gid):
                del self.groups[gid]
                self.records.gone(gid)

    def _deadline(self, group: ConsumerGroup) -> float:
        since = self._empty_since.get(group.group_id)
        if since is None:
            return group.next_deadline()
        return since + self.config.empty_group_retention_ms / 1000

    def _rearm(self, group: ConsumerGroup) -> None:
        if not group.members or group.next_deadline() < self._next_wake:
            self._wakeup.set()

    # ----------------------------------------------------------------- requests
    async def heartbeat(
        self, request: Any, client_id: str, client_host: str, api_version: int = 1
    ) -> dict[str, Any]:
        """ConsumerGroupHeartbeat (any version) -> response dict, once what it tells is
        durable."""
        group_id = request.group_id
        base: dict[str, Any] = {
            "member_id": request.member_id or None,
            "member_epoch": request.member_epoch,
            "heartbeat_interval": self.config.consumer_heartbeat_interval_ms,
            "assignment": None,
        }
        invalid = heartbeat_request_error(request, api_version)
        if invalid is not None:
            return {**base, "error_code": INVALID_REQUEST, "error_message": invalid}
        if not self.owns(group_id):
            return {**base, "error_code": NOT_COORDINATOR}
        group = self.groups.get(group_id)
        if group is None:
            if self.classic_in_use(group_id):
                message = f"group {group_id} is not a consumer group"
                return {**base, "error_code": GROUP_ID_NOT_FOUND, "error_message": message}
            group = ConsumerGroup(group_id, self.config.consumer_session_timeout_ms)
            group.hold_until = self._hold_until
        topics = self.topics.topic_partition_counts()
        owned = request.topic_partitions
        inp = HeartbeatInput(
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=_ms(request.rebalance_timeout),
            subscribed_topic_names=(
                None
                if request.subscribed_topic_names is None
                else list(request.subscribed_topic_names)
            ),
            subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
            server_assignor=request.server_assignor,
            owned=None if owned is None else self._by_name(owned),
            client_id=client_id,
            client_host=client_host,
        )
        result = group.heartbeat(inp, topics, trio.current_time())
        if group.members and group_id not in self.groups:
            self.drop_classic(group_id)
            self.groups[group_id] = group
        self._rearm(group)
        # An error answer changed nothing and tells nothing: no record to wait for.
        if result.error_code == NONE and self.groups.get(group_id) is group:
            try:
                await self.records.store(group, result.member_id or None)
            except Exception:
                log.exception("consumer group %s: recording it failed", group_id)
                # As Kafka when it cannot write the group; the member resends a full request.
                return {**base, "error_code": COORDINATOR_NOT_AVAILABLE}
        resp = {
            **base,
            "error_code": result.error_code,
            "error_message": result.error_message,
            "member_id": result.member_id or None,
            "member_epoch": result.member_epoch,
        }
        if result.assignment is not None:
            resp["assignment"] = {"topic_partitions": self._by_id(result.assignment)}
        return resp

    def describe(
        self, group_ids: Sequence[str], include_authorized_operations: bool
    ) -> dict[str, Any]:
        ops = authorized_operations(ResourceType.GROUP, include_authorized_operations)
        out = []
        for gid in group_ids:
            desc: dict[str, Any] = {
                "error_code": NONE,
                "error_message": None,
                "group_id": gid,
                "group_state": "Dead",
                "group_epoch": -1,
                "assignment_epoch": -1,
                "assignor_name": "",
                "members": [],
                "authorized_operations": ops,
            }
            group = self.groups.get(gid)
            if not gid:
                desc["error_code"] = INVALID_GROUP_ID
            elif not self.owns(gid):
                desc["error_code"] = NOT_COORDINATOR
            elif group is None:
                desc["error_code"] = GROUP_ID_NOT_FOUND
                desc["error_message"] = f"group {gid} is not a consumer group"
            else:
                desc.update(
                    group_state=group.state,
                    group_epoch=group.group_epoch,
                    assignment_epoch=group.assignment_epoch,
                    assignor_name=group.assignor_name,
                    members=[
                        {
                            "member_id": m.member_id,
                            "instance_id": m.instance_id,
                            "rack_id": m.rack_id,
                            "member_epoch": m.member_epoch,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "subscribed_topic_names": list(m.subscribed_names),
                            "subscribed_topic_regex": m.subscribed_regex,
                            "assignment": {"topic_partitions": self._described(m.assigned)},
                            "target_assignment": {
                                "topic_partitions": self._described(
                                    group.target.get(m.member_id, {})
                                )
                            },
                            "member_type": MEMBER_TYPE_CONSUMER,
                        }
                        for m in group.members.values()
                    ],
                )
            out.append(desc)
        return {"groups": out}

    # ------------------------------------------------------- for other modules
    def in_use(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def remove_group(self, group_id: str) -> None:
        if self.groups.pop(group_id, None) is not None:
            self.records.gone(group_id)
        self._empty_since.pop(group_id, None)

    def listed(self) -> list[dict[str, Any]]:
        return [
            {
                "group_id": g.group_id,
                "protocol_type": "consumer",
                "group_state": g.state,
                "group_type": "consumer",
            }
            for g in self.groups.values()
        ]

    # ------------------------------------------------------------ topic ids
    def _by_name(self, topic_partitions: Sequence[Any]) -> Assignment:
        out: dict[str, frozenset[int]] = {}
        for tp in topic_partitions:
            name = self.topics.topic_name(tp.topic_id) if tp.topic_id is not None else None
            if name is not None:
                out[name] = frozenset(int(p) for p in tp.partitions)
        return out

    def _by_id(self, assignment: Assignment) -> list[dict[str, Any]]:
        return [
            {"topic_id": t["topic_id"], "partitions": t["partitions"]}
            for t in self._described(assignment)
        ]

    def _described(self, assignment: Assignment) -> list[dict[str, Any]]:
        out = []
        for name, partitions in sorted(assignment.items()):
            topic_id = self.topics.topic_id(name)
            if topic_id is not None and partitions:
                out.append(
                    {"topic_name": name, "topic_id": topic_id, "partitions": sorted(partitions)}
                )
        return out


def _blank(value: str | None) -> bool:
    return value is not None and not value.strip()


def heartbeat_request_error(request: Any, api_version: int) -> str | None:
    """Kafka's checks of a ConsumerGroupHeartbeat (INVALID_REQUEST with this message)."""
    epoch = request.member_epoch
    if (api_version >= 1 or epoch > 0 or epoch == LEAVE_EPOCH) and not request.member_id.strip():
        return "MemberId can't be empty."
    if not request.group_id.strip():
        return "GroupId can't be empty."
    if _blank(request.instance_id):
        return "InstanceId can't be empty."
    if _blank(request.rack_id):
        return "RackId can't be empty."
    if epoch == 0:
        if _ms(request.rebalance_timeout) == -1:
            return "RebalanceTimeoutMs must be provided in first request."
        if request.topic_partitions is None or request.topic_partitions:
            return "TopicPartitions must be empty when (re-)joining."
        regex = getattr(request, "subscribed_topic_regex", None)
        if request.subscribed_topic_names is None and regex is None:
            return (
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining."
            )
    elif epoch == STATIC_LEAVE_EPOCH:
        if request.instance_id is None:
            return "InstanceId can't be null."
    elif epoch < STATIC_LEAVE_EPOCH:
        return "MemberEpoch is invalid."
    return None


def _ms(value: Any) -> int:
    if value is None:
        return -1
    if hasattr(value, "total_seconds"):
        return round(value.total_seconds() * 1000)
    return int(value)
