"""OffsetForLeaderEpoch (KIP-320), answered from any partition store (a main's log or a zone
proxy's mirror), so a consumer validating its position after a leader change is answered in
its own zone.

A leader answers, for the epoch a consumer names, where that epoch's log ends, and the consumer
finds its position truncated when it lies past that. zonefleet never truncates a record a
consumer could have read: a takeover keeps every durable batch at its offset
(main_broker/cluster/reassignment.py), so each epoch's log is a prefix of the current one. The
end of any epoch up to the current one is therefore answered as the log end: a position is
never past it, and no consumer resets on a failover.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafka_wire.fetch_serving import FetchSource, leader_epoch_error

__all__ = ["API_OFFSET_FOR_LEADER_EPOCH", "offsets_for_leader_epochs"]

API_OFFSET_FOR_LEADER_EPOCH = 23
UNDEFINED = -1


def offsets_for_leader_epochs(source: FetchSource[Any], request: Any) -> dict[str, Any]:
    """The response data (v2+) for a decoded OffsetForLeaderEpoch request."""
    topics = []
    for topic in request.topics:
        state = source.topic_by_name(topic.topic)
        partitions = state.partitions if state is not None else ()
        answers = []
        for want in topic.partitions:
            index = want.partition
            part = partitions[index] if 0 <= index < len(partitions) else None
            answer: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "partition": index,
                "leader_epoch": UNDEFINED,
                "end_offset": UNDEFINED,
            }
            if part is None:
                answer["error_code"] = ErrorCode.unknown_topic_or_partition
            elif not part.owned:
                answer["error_code"] = ErrorCode.not_leader_or_follower
            elif (
                error := leader_epoch_error(part.leader_epoch, want.current_leader_epoch)
            ) is not None:
                answer["error_code"] = error
            elif 0 <= want.leader_epoch <= part.leader_epoch:
                answer["leader_epoch"] = want.leader_epoch
                answer["end_offset"] = part.next_offset
            answers.append(answer)
        topics.append({"topic": topic.topic, "partitions": answers})
    return {"throttle_time": 0, "topics": topics}
