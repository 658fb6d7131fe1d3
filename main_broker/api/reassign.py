"""AlterPartitionReassignments (45), ListPartitionReassignments (46) and ElectLeaders (43).

A reassignment is recorded in the cluster metadata document (main_broker/cluster/reassignment.py);
the mains involved carry it out (main_broker/cluster/handoff.py). Any main answers, so a proxy
relays these to any of them. With one replica per partition, the preferred leader is always the
current one: ElectLeaders has nothing to elect.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from main_broker.cluster.doc import ClusterDoc
from main_broker.cluster.reassignment import (
    MoveRefused,
    cancel_move,
    ongoing_listing,
    request_move,
    validate_target,
)
from main_broker.cluster.zone_view import NotAMain, fleet_topology, main_for_replica
from s3_commit import ObjectStoreError

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

PREFERRED, UNCLEAN = 0, 1


async def alter_partition_reassignments(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    """One CAS of the document for the whole request; each partition's outcome is decided
    on the copy that CAS started from (and decided again when it has to retry)."""
    mains = broker.cluster.main_ids
    allow_rf_change = getattr(req, "allow_replication_factor_change", True)
    now_ms = int(time.time() * 1000)
    top: tuple[int, str | None] = (ErrorCode.none, None)
    # Per topic, per partition entry in request order (an entry may repeat a partition).
    outcomes: list[list[tuple[int, str | None]]] = []

    def change(doc: ClusterDoc) -> ClusterDoc:
        outcomes.clear()
        for topic in req.topics:
            rows: list[tuple[int, str | None]] = []
            outcomes.append(rows)
            for part in topic.partitions:
                try:
                    if part.replicas is None:
                        doc = cancel_move(doc, topic.name, part.partition_index)
                    else:
                        replicas = _mains_named(
                            doc, topic.name, part.partition_index, part.replicas
                        )
                        target = validate_target(replicas, mains, allow_rf_change)
                        doc = request_move(doc, topic.name, part.partition_index, target, now_ms)
                    rows.append((ErrorCode.none, None))
                except MoveRefused as exc:
                    rows.append((exc.code, exc.message))
                except NotAMain as exc:
                    rows.append((ErrorCode.invalid_replica_assignment, str(exc)))
        return doc

    topology = fleet_topology(broker.config)

    def _mains_named(doc: ClusterDoc, name: str, index: int, replicas: Any) -> list[int]:
        # The ids of the client's zone view: its zone's proxy stands for another zone's main.
        meta = doc.topics.get(name)
        current = (
            meta.leaders[index] if meta is not None and 0 <= index < len(meta.leaders) else None
        )
        return [main_for_replica(topology, r, mains, name, index, current) for r in replicas]

    try:
        # A lone main decides on its own topics and records nothing (cluster.view.LoneMain).
        await broker.cluster.change_document(change)
    except (ObjectStoreError, OSError) as exc:
        # Nothing was recorded: every entry gets the retriable error Kafka gives when its
        # controller does not answer in time.
        message = f"the cluster metadata store did not take the change: {exc}"
        top = (ErrorCode.request_timed_out, message)
        outcomes[:] = [[top] * len(topic.partitions) for topic in req.topics]
    return {
        "throttle_time": 0,
        "allow_replication_factor_change": allow_rf_change,
        "error_code": top[0],
        "error_message": top[1],
        "responses": [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": part.partition_index,
                        "error_code": code,
                        "error_message": msg,
                    }
                    for part, (code, msg) in zip(topic.partitions, rows, strict=True)
                ],
            }
            for topic, rows in zip(req.topics, outcomes, strict=True)
        ],
    }


async def list_partition_reassignments(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    await broker.cluster.refresh()
    wanted = None
    if req.topics is not None:
        wanted = [(t.name, list(t.partition_indexes)) for t in req.topics]
    # A lone main's document has no move under way: it lists none.
    topics = ongoing_listing(broker.cluster.document(), wanted)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "topics": topics,
    }


async def elect_leaders(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    """As Kafka's controller answers with one replica per partition: that replica leads, so
    a preferred or unclean election is ELECTION_NOT_NEEDED; unknown partitions get
    UNKNOWN_TOPIC_OR_PARTITION; a request for all partitions lists none (Kafka leaves out
    those that need no election)."""
    if getattr(req, "election_type", PREFERRED) not in (PREFERRED, UNCLEAN):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.invalid_request,
            "replica_election_results": [],
        }
    store = broker.store
    results: list[dict[str, Any]] = []
    if req.topic_partitions is None:
        results = [{"topic": name, "partition_result": []} for name in sorted(store.topics)]
    else:
        for topic in req.topic_partitions:
            state = store.topics.get(topic.topic)
            rows = []
            for index in topic.partitions:
                if state is None or not 0 <= index < len(state.partitions):
                    code = ErrorCode.unknown_topic_or_partition
                    message: str | None = (
                        f"No such topic as {topic.topic}"
                        if state is None
                        else f"No such partition as {topic.topic}-{index}"
                    )
                else:
                    code, message = ErrorCode.election_not_needed, None
                rows.append({"partition_id": index, "error_code": code, "error_message": message})
            results.append({"topic": topic.topic, "partition_result": rows})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "replica_election_results": results}


REASSIGN_APIS: dict[int, tuple[str, int, int]] = {
    43: ("ElectLeaders", 0, 2),
    45: ("AlterPartitionReassignments", 0, 1),
    46: ("ListPartitionReassignments", 0, 0),
}
REASSIGN_HANDLERS = {
    43: elect_leaders,
    45: alter_partition_reassignments,
    46: list_partition_reassignments,
}
