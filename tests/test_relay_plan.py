"""Where a proxy relays admin requests: split by partition leader, or asked of several mains
and merged (proxy_broker.relay_plan)."""

from __future__ import annotations

from kafka_wire.codec import (
    build_request,
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    parse_request_header,
)
from proxy_broker.relay_plan import plan_relay

LEADERS = {("t", 0): 1, ("t", 1): 2, ("t", 2): 3, ("u", 0): 2}


def _frame(api_key: int, version: int, data: dict[str, object]) -> bytes:
    return encode_request(api_key, version, 5, "c", build_request(api_key, version, data))


def test_describe_producers_is_split_by_leader_and_merged() -> None:
    frame = _frame(61, 0, {"topics": [{"name": "t", "partition_indexes": [0, 1, 2]},
                                      {"name": "u", "partition_indexes": [0]}]})  # fmt: skip
    header = parse_request_header(frame)
    plan = plan_relay(header, frame, [1, 2, 3], 1, lambda t, p: LEADERS.get((t, p)))
    asked = {}
    for main, sub in plan.calls:
        request = decode_request(parse_request_header(sub), bytearray(sub))
        asked[main] = {(t.name, p) for t in request.topics for p in t.partition_indexes}
    assert asked == {1: {("t", 0)}, 2: {("t", 1), ("u", 0)}, 3: {("t", 2)}}
    assert plan.merge is not None
    answers = []
    for main, parts in sorted(asked.items()):
        topics: dict[str, list[dict[str, object]]] = {}
        for name, index in sorted(parts):
            producers = [{"producer_id": main}]
            part = {"partition_index": index, "error_code": 0, "active_producers": producers}
            topics.setdefault(name, []).append(part)
        data = {"topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
        answers.append(encode_response(header, build_response(61, 0, data)))
    _, merged = decode_response(61, 0, plan.merge(answers))
    got = {
        (t.name, p.partition_index): p.active_producers[0].producer_id
        for t in merged.topics
        for p in t.partitions
    }
    assert got == {k: v for k, v in LEADERS.items()}


def test_describe_log_dirs_asks_the_other_zones_mains() -> None:
    frame = _frame(35, 4, {"topics": None})
    header = parse_request_header(frame)
    plan = plan_relay(header, frame, [1, 2, 3], 1, lambda t, p: None, foreign_mains=[2, 3])
    assert [main for main, _ in plan.calls] == [2, 3]
    alone = plan_relay(header, frame, [1, 2, 3], 1, lambda t, p: None)
    assert [main for main, _ in alone.calls] == [1, 2, 3]
    assert plan.merge is not None
    answers = [
        encode_response(
            header,
            build_response(
                35,
                4,
                {
                    "error_code": 0,
                    "results": [
                        {
                            "error_code": 0,
                            "log_dir": f"wal/main-{m}",
                            "topics": [],
                            "total_bytes": -1,
                            "usable_bytes": -1,
                        }
                    ],
                },
            ),
        )
        for m in (2, 3)
    ]
    _, merged = decode_response(35, 4, plan.merge(answers))
    assert [r.log_dir for r in merged.results] == ["wal/main-2", "wal/main-3"]


def test_acl_and_scram_requests_go_whole_to_one_main() -> None:
    """The ACL and SCRAM documents are the same for every main: one call, the frame as is."""
    filt = {"resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1}
    requests = [
        (29, 3, {**filt, "permission_type": 1}),
        (30, 3, {"creations": [{"resource_type": 2, "resource_name": "t", "principal": "U:a"}]}),
        (31, 3, {"filters": [{**filt, "permission_type": 1}]}),
        (50, 0, {"users": None}),
        (51, 0, {"deletions": [{"name": "a", "mechanism": 1}], "upsertions": []}),
    ]
    for key, version, data in requests:
        frame = _frame(key, version, data)
        plan = plan_relay(parse_request_header(frame), frame, [1, 2, 3], 2, lambda t, p: None)
        assert plan.calls == [(2, frame)] and plan.merge is None


def _groups_on_each_main(mains: list[int]) -> dict[int, str]:
    from zone_router import group_coordinator

    out: dict[int, str] = {}
    i = 0
    while len(out) < len(mains):
        out.setdefault(group_coordinator(f"g{i}", mains), f"g{i}")
        i += 1
    return out


def test_group_requests_go_to_each_groups_coordinator_and_are_merged() -> None:
    mains = [1, 2, 3]
    groups = _groups_on_each_main(mains)
    no_leader = lambda t, p: None  # noqa: E731
    # DeleteGroups: split by coordinator, one result per group after the merge.
    frame = _frame(42, 2, {"groups_names": list(groups.values())})
    header = parse_request_header(frame)
    plan = plan_relay(header, frame, mains, 1, no_leader)
    asked = {
        main: list(decode_request(parse_request_header(sub), bytearray(sub)).groups_names)
        for main, sub in plan.calls
    }
    assert asked == {main: [g] for main, g in groups.items()}
    assert plan.merge is not None
    answers = [
        encode_response(
            header, build_response(42, 2, {"results": [{"group_id": g, "error_code": 0}]})
        )
        for names in asked.values()
        for g in names
    ]
    _, merged = decode_response(42, 2, plan.merge(answers))
    assert sorted(r.group_id for r in merged.results) == sorted(groups.values())
    # ConsumerGroupDescribe and OffsetFetch v8+ (several groups) split the same way.
    frame = _frame(
        69, 1, {"group_ids": list(groups.values()), "include_authorized_operations": False}
    )
    plan = plan_relay(parse_request_header(frame), frame, mains, 1, no_leader)
    assert sorted(main for main, _ in plan.calls) == mains
    fetch = {
        "groups": [{"group_id": g, "topics": None} for g in groups.values()],
        "require_stable": False,
    }
    frame = _frame(9, 8, fetch)
    plan = plan_relay(parse_request_header(frame), frame, mains, 1, no_leader)
    for main, sub in plan.calls:
        request = decode_request(parse_request_header(sub), bytearray(sub))
        assert [g.group_id for g in request.groups] == [groups[main]]
    # Single-group requests: OffsetDelete and ConsumerGroupHeartbeat go whole to the coordinator.
    main, group = 3, groups[3]
    frame = _frame(47, 0, {"group_id": group, "topics": []})
    assert [
        m for m, _ in plan_relay(parse_request_header(frame), frame, mains, 1, no_leader).calls
    ] == [main]
    beat = {"group_id": group, "member_id": "m", "member_epoch": 0, "rebalance_timeout": 1000}
    frame = _frame(68, 1, beat)
    assert [
        m for m, _ in plan_relay(parse_request_header(frame), frame, mains, 1, no_leader).calls
    ] == [main]
    # An empty DeleteGroups still gets its (empty) answer from one main.
    frame = _frame(42, 2, {"groups_names": []})
    assert len(plan_relay(parse_request_header(frame), frame, mains, 1, no_leader).calls) == 1


def test_list_groups_asks_only_the_mains_the_proxy_stands_for() -> None:
    # The zone's own main lists its groups itself (clients ask every broker they see).
    frame = _frame(16, 4, {"states_filter": []})
    header = parse_request_header(frame)
    plan = plan_relay(header, frame, [1, 2, 3], 1, lambda t, p: None, foreign_mains=[2, 3])
    assert [main for main, _ in plan.calls] == [2, 3]
    everyone = plan_relay(header, frame, [1, 2, 3], 1, lambda t, p: None)
    assert [main for main, _ in everyone.calls] == [1, 2, 3]
    # Every main in the proxy's zone: nothing to ask, an empty list.
    alone = plan_relay(header, frame, [1, 2], 1, lambda t, p: None, foreign_mains=[])
    assert alone.calls == [] and alone.merge is not None
    _, resp = decode_response(16, 4, alone.merge([]))
    assert resp.error_code == 0 and list(resp.groups) == []
