"""The audit log (issue 15): its line format (golden, one line of each event kind), its rate
limits, the file writer, the config keys, and the events the proxy's ACL checks and the
SASL gate hook report (telemetry/audit.py, fleet/audit_file.py, proxy_broker/access.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.audit_file import AuditFile, audit_log_path, open_audit_log
from fleet.config import ConfigError, parse_fleet_config
from kafka_wire.acl import AclBinding
from kafka_wire.codec import (
    RequestHeader,
    build_request,
    decode_request,
    encode_request,
    parse_request_header,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.security_docs import AclsDoc
from kafka_wire.server_loop import ConnectionIdentity, ConnectionInfo
from proxy_broker.access import AclSettings, NotAuthorized, ProxyAccess
from proxy_broker.access_verdict import Verdict
from proxy_broker.secure_listeners import ProxyListeners
from telemetry import BadInputLog, BrokerMetrics, MetricsRegistry
from telemetry.audit import (
    AclEntry,
    AclsChanged,
    AuditDropped,
    AuditLog,
    AuthenticationFailed,
    OperationDenied,
    ScramChange,
    ScramCredentialsChanged,
    change_outcome,
    encode_line,
)

TS = 1795343400.123  # 2026-11-22T10:30:00.123Z

AUTH_FAILED = AuthenticationFailed(
    "User:ANONYMOUS",
    "10.0.1.7",
    53114,
    "SASL_SSL",
    "SCRAM-SHA-512",
    "alice",
    "client proof mismatch",
    "SASL_AUTHENTICATION_FAILED",
)
DENIED = OperationDenied(
    "User:alice",
    "10.0.1.7",
    53120,
    "SASL_SSL",
    None,
    "TOPIC",
    "payroll",
    "WRITE",
    "TOPIC_AUTHORIZATION_FAILED",
)
ACLS = AclsChanged(
    "User:ANONYMOUS",
    "10.0.1.9",
    0,
    "relay:102",
    "CreateAcls",
    (AclEntry("TOPIC", "orders-", "PREFIXED", "User:alice", "*", "WRITE", "ALLOW"),),
    "NONE",
)
SCRAM = ScramCredentialsChanged(
    "User:ANONYMOUS",
    "10.0.1.9",
    0,
    "relay:102",
    "AlterUserScramCredentials",
    (
        ScramChange("alice", "SCRAM-SHA-512", "upsert", "NONE"),
        ScramChange("bob", "SCRAM-SHA-256", "delete", "RESOURCE_NOT_FOUND"),
    ),
    "PARTIAL",
)

# docs/formats.md, "Audit log": one line of each kind, byte for byte.
GOLDEN = {
    "authentication_failed": (
        '{"v":1,"ts":"2026-11-22T10:30:00.123Z","node":"proxy-102",'
        '"event":"authentication_failed","principal":"User:ANONYMOUS","peer_host":"10.0.1.7",'
        '"peer_port":53114,"listener":"SASL_SSL","mechanism":"SCRAM-SHA-512","user":"alice",'
        '"reason":"client proof mismatch","outcome":"SASL_AUTHENTICATION_FAILED",'
        '"suppressed":0}'
    ),
    "operation_denied": (
        '{"v":1,"ts":"2026-11-22T10:30:00.123Z","node":"proxy-102","event":"operation_denied",'
        '"principal":"User:alice","peer_host":"10.0.1.7","peer_port":53120,'
        '"listener":"SASL_SSL","api":null,"resource_type":"TOPIC","resource":"payroll",'
        '"operation":"WRITE","outcome":"TOPIC_AUTHORIZATION_FAILED","suppressed":0}'
    ),
    "acl_change": (
        '{"v":1,"ts":"2026-11-22T10:30:00.123Z","node":"main-1","event":"acl_change",'
        '"principal":"User:ANONYMOUS","peer_host":"10.0.1.9","peer_port":0,'
        '"listener":"relay:102","api":"CreateAcls","acls":[{"resource_type":"TOPIC",'
        '"resource":"orders-","pattern_type":"PREFIXED","principal":"User:alice","host":"*",'
        '"operation":"WRITE","permission":"ALLOW"}],"outcome":"NONE"}'
    ),
    "scram_change": (
        '{"v":1,"ts":"2026-11-22T10:30:00.123Z","node":"main-1","event":"scram_change",'
        '"principal":"User:ANONYMOUS","peer_host":"10.0.1.9","peer_port":0,'
        '"listener":"relay:102","api":"AlterUserScramCredentials","changes":[{"user":"alice",'
        '"mechanism":"SCRAM-SHA-512","change":"upsert","outcome":"NONE"},{"user":"bob",'
        '"mechanism":"SCRAM-SHA-256","change":"delete","outcome":"RESOURCE_NOT_FOUND"}],'
        '"outcome":"PARTIAL"}'
    ),
    "audit_dropped": (
        '{"v":1,"ts":"2026-11-22T10:30:00.123Z","node":"proxy-102","event":"audit_dropped",'
        '"count":4711}'
    ),
}


def test_golden_line_of_each_event_kind() -> None:
    lines = {
        "authentication_failed": encode_line(TS, "proxy-102", AUTH_FAILED),
        "operation_denied": encode_line(TS, "proxy-102", DENIED),
        "acl_change": encode_line(TS, "main-1", ACLS),
        "scram_change": encode_line(TS, "main-1", SCRAM),
        "audit_dropped": encode_line(TS, "proxy-102", AuditDropped(4711)),
    }
    assert lines == GOLDEN
    for kind, line in lines.items():
        doc = json.loads(line)
        assert list(doc)[:4] == ["v", "ts", "node", "event"] and doc["event"] == kind


def test_formats_doc_shows_the_golden_lines() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "formats.md").read_text()
    for line in GOLDEN.values():
        assert line in doc, f"docs/formats.md lacks {line[:80]}..."


def test_a_line_is_one_ascii_line_and_long_text_is_cut() -> None:
    event = OperationDenied(
        "User:\u00e9ve\n", "h", 1, "L", "Fetch", "GROUP", "g" * 5000, "READ", "DENIED"
    )
    line = encode_line(TS, "proxy-1", event, 3)
    assert "\n" not in line and line.isascii()
    doc = json.loads(line)
    assert doc["principal"] == "User:\u00e9ve\n"
    assert doc["resource"] == "g" * 512 + "..."
    assert doc["suppressed"] == 3


def test_change_outcome() -> None:
    assert change_outcome([]) == "NONE"
    assert change_outcome(["NONE", "NONE"]) == "NONE"
    assert change_outcome(["NONE", "RESOURCE_NOT_FOUND"]) == "PARTIAL"
    assert change_outcome(["UNKNOWN_SERVER_ERROR"]) == "FAILED"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_log(**kw: Any) -> tuple[AuditLog, list[dict[str, Any]], Clock]:
    """An audit log on a fake clock (wall time TS at its start) whose lines are parsed."""
    out: list[dict[str, Any]] = []
    clock = Clock()

    def write(line: str) -> None:
        assert "\n" not in line
        out.append(json.loads(line))

    log = AuditLog("proxy-101", write, clock=clock, wall=lambda: TS + clock.now - 1000.0, **kw)
    return log, out, clock


def denied(resource: str = "payroll", port: int = 5000) -> OperationDenied:
    return OperationDenied(
        "User:alice", "10.0.0.1", port, "SASL", None, "TOPIC", resource, "READ",
        "TOPIC_AUTHORIZATION_FAILED",
    )  # fmt: skip


def test_identical_denials_are_held_back_and_counted_in_the_late_line() -> None:
    log, out, clock = make_log(interval_s=10.0)
    log.record(denied(port=1))
    for i in range(50):  # a client retrying in a loop, reconnecting each time
        clock.now += 0.1
        log.record(denied(port=100 + i))
    assert len(out) == 1 and out[0]["suppressed"] == 0 and out[0]["peer_port"] == 1
    log.record(denied("other"))  # another key is not held back by the first one's window
    assert len(out) == 2
    clock.now += 6.0  # the first window (opened at 1000.0) has passed
    log.sweep()
    assert len(out) == 3
    late = out[2]
    # The last of the 50 held back, written late with its own time: 1 + 49 + 1 = 51 events.
    assert (late["peer_port"], late["suppressed"]) == (149, 49)
    assert late["ts"] == "2026-11-22T10:30:05.123Z"
    # A new window: the next one is written at once.
    log.record(denied(port=7))
    assert out[-1]["peer_port"] == 7 and out[-1]["suppressed"] == 0
    # close() writes what is still held, whatever the windows.
    log.record(denied(port=8))
    log.close()
    assert out[-1]["peer_port"] == 8 and out[-1]["suppressed"] == 0
    assert sum(1 + line["suppressed"] for line in out) == 1 + 50 + 1 + 1 + 1


def test_changes_are_never_held_back() -> None:
    log, out, _ = make_log()
    for _ in range(5):
        log.record(ACLS)
    assert [line["event"] for line in out] == ["acl_change"] * 5


def test_an_overall_budget_bounds_distinct_denials_and_says_what_it_dropped() -> None:
    log, out, clock = make_log(burst=10, rate_per_s=2.0, interval_s=60.0)
    for i in range(1000):  # a new resource name each time: no window holds them back
        log.record(denied(f"t{i}"))
    assert len(out) == 10
    clock.now += 1.0  # two lines' worth of budget
    log.sweep()
    assert out[-1] == {**out[-1], "event": "audit_dropped", "count": 990}
    log.record(denied("fresh"))
    assert out[-1]["resource"] == "fresh"


def test_keys_are_bounded() -> None:
    log, out, _ = make_log(max_keys=3)
    for name in ("a", "b", "c"):
        log.record(denied(name))
        log.record(denied(name))  # held
    log.record(denied("d"))  # evicts a's window, which writes its held event
    assert [line["resource"] for line in out] == ["a", "b", "c", "a", "d"]
    assert len(log._held) == 3


def test_off_writes_nothing() -> None:
    log = AuditLog.off("main-1")
    assert not log.enabled
    log.record(DENIED)
    log.sweep()
    log.close()


# -- the file ------------------------------------------------------------------------------


def test_audit_file_appends_whole_lines_0600_and_mends_a_torn_line(tmp_path: Path) -> None:
    path = audit_log_path(tmp_path / "audit" / "{node}.jsonl", "proxy-101")
    assert path == tmp_path / "audit" / "proxy-101.jsonl"
    audit, out = open_audit_log(str(tmp_path / "audit" / "{node}.jsonl"), "proxy-101")
    assert out is not None
    assert not path.exists()  # created on the first line only
    audit.record(AUTH_FAILED)
    audit.record(ACLS)
    audit.close()
    out.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["authentication_failed", "acl_change"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with open(path, "a") as f:
        f.write('{"v":1,"torn')  # a crash mid-line
    again = AuditFile(path)
    again.write(encode_line(TS, "proxy-101", DENIED))
    again.close()
    lines = path.read_text().splitlines()
    assert lines[-2] == '{"v":1,"torn' and json.loads(lines[-1])["event"] == "operation_denied"


def test_audit_file_survives_an_unwritable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = AuditFile(blocker / "audit.jsonl")  # its directory is a file
    out.write("{}")
    out.close()
    assert (out.lines_written, out.lines_lost) == (0, 1)


def test_write_does_not_wait_for_the_disk(tmp_path: Path) -> None:
    out = AuditFile(tmp_path / "a.jsonl")
    started = time.perf_counter()
    for i in range(2000):
        out.write(json.dumps({"i": i}))
    queued = time.perf_counter() - started
    out.close()
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 2000
    assert queued < 0.5


# -- config --------------------------------------------------------------------------------

SECRET = "s" * 32


def fleet_doc(security: dict[str, Any] | None = None, admin: dict[str, Any] | None = None) -> Any:
    doc: dict[str, Any] = {
        "fleet": {"data_dir": "data"},
        "internal": {"secret": SECRET},
        "zones": [{"name": "az1"}],
        "main_brokers": [{"node_id": 1, "zone": "az1", "port": 9092, "rpc_port": 9094}],
        "proxies": [{"node_id": 101, "zone": "az1", "port": 9192, "admin_host": "10.0.0.5"}],
    }
    if security is not None:
        doc["security"] = security
    if admin is not None:
        doc["admin"] = admin
    return doc


def test_audit_log_config(tmp_path: Path) -> None:
    config = parse_fleet_config(fleet_doc(), tmp_path, discover=None)
    assert config.mains[0].audit_log == str(tmp_path / "data" / "audit" / "{node}.jsonl")
    assert config.proxies[0].audit_log == config.mains[0].audit_log
    for off in ("", False):
        config = parse_fleet_config(fleet_doc({"audit_log": off}), tmp_path, discover=None)
        assert config.mains[0].audit_log is None and config.proxies[0].audit_log is None
    config = parse_fleet_config(fleet_doc({"audit_log": "logs/a.jsonl"}), tmp_path, discover=None)
    assert config.mains[0].audit_log == str(tmp_path / "logs" / "a.jsonl")
    with pytest.raises(ConfigError, match="audit_log"):
        parse_fleet_config(fleet_doc({"audit_log": 3}), tmp_path, discover=None)


# -- the proxy's ACL checks and SASL failures ------------------------------------------------

TOPIC, GROUP, CLUSTER = 2, 3, 4
READ, WRITE = 3, 4


def recording_access(*bindings: AclBinding) -> tuple[ProxyAccess, list[dict[str, Any]]]:
    log, out, _ = make_log()
    a = ProxyAccess(AclSettings(True, frozenset({"User:admin"})), log)
    a.update(AclsDoc(1, frozenset(bindings)))
    return a, out


def conn(principal: str) -> ConnectionInfo:
    return ConnectionInfo("10.0.0.1", 5000, 9092, "SASL", ConnectionIdentity(principal))


def relayed(
    a: ProxyAccess, who: str, key: int, version: int, data: dict[str, Any], topics: Any = None
) -> Verdict | None:
    frame = encode_request(key, version, 9, "c", build_request(key, version, data))
    header = parse_request_header(frame)
    return a.check_relayed(header, decode_request(header, bytearray(frame)), conn(who), topics)


class OneTopic:
    def topic_name(self, topic_id: object) -> None:
        return None

    def topic_exists(self, name: str) -> bool:
        return name == "there"


def test_proxy_denials_are_audited() -> None:
    a, out = recording_access(
        AclBinding(TOPIC, "t", 3, "User:alice", "*", READ, 3),
        AclBinding(TOPIC, "there", 3, "User:alice", "*", READ, 3),
    )
    alice = conn("User:alice")
    assert a.allows(alice, READ, TOPIC, "t")  # type: ignore[arg-type]
    assert out == []
    assert not a.allows(alice, WRITE, TOPIC, "t")  # type: ignore[arg-type]
    assert out[-1] == {
        **out[-1],
        "event": "operation_denied",
        "principal": "User:alice",
        "peer_host": "10.0.0.1",
        "peer_port": 5000,
        "listener": "SASL",
        "resource_type": "TOPIC",
        "resource": "t",
        "operation": "WRITE",
        "outcome": "TOPIC_AUTHORIZATION_FAILED",
    }
    # Topics left out of an all-topics Metadata answer are not audited; named ones are.
    answer = {"topics": [{"name": "hidden", "partitions": []}]}
    every = relayed(a, "User:alice", 3, 12, {"topics": None})
    assert every is not None and every.complete is not None
    every.complete(answer)
    # Nor a denied auto-creation of a topic that exists, as in Kafka (CREATE on the cluster).
    relayed(a, "User:alice", 3, 12, {"topics": [{"name": "there"}]}, OneTopic())
    assert len(out) == 1
    relayed(a, "User:alice", 3, 12, {"topics": [{"name": "hidden"}]})
    assert out[-1]["resource"] == "hidden" and out[-1]["operation"] == "DESCRIBE"
    assert out[-1]["api"] == "Metadata"
    # A group API: GROUP_AUTHORIZATION_FAILED.
    join = {"group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
            "member_id": "", "protocol_type": "consumer", "protocols": []}  # fmt: skip
    relayed(a, "User:alice", 11, 9, join)
    assert (out[-1]["resource_type"], out[-1]["outcome"]) == ("GROUP", "GROUP_AUTHORIZATION_FAILED")
    # An idempotent producer without WRITE anywhere.
    relayed(a, "User:bob", 22, 4, {"transactional_id": None, "transaction_timeout_ms": 60000})
    assert (out[-1]["api"], out[-1]["operation"], out[-1]["outcome"]) == (
        "InitProducerId",
        "IDEMPOTENT_WRITE",
        "CLUSTER_AUTHORIZATION_FAILED",
    )
    # An admin API: CLUSTER_AUTHORIZATION_FAILED, once per request.
    n = len(out)
    relayed(a, "User:alice", 30, 3, {"creations": []})
    assert len(out) == n + 1
    assert (out[-1]["api"], out[-1]["operation"], out[-1]["outcome"]) == (
        "CreateAcls",
        "ALTER",
        "CLUSTER_AUTHORIZATION_FAILED",
    )
    # An API nothing checks closes the connection.
    with pytest.raises(NotAuthorized):
        a.check_known(RequestHeader(57, 1, 9, "c", 0), alice)
    assert (out[-1]["api"], out[-1]["resource_type"], out[-1]["outcome"]) == (
        "UpdateFeatures",
        "CLUSTER",
        "CONNECTION_CLOSED",
    )
    # The admin's requests and an authorizer that is off audit nothing.
    n = len(out)
    assert relayed(a, "User:admin", 30, 3, {"creations": []}) is None
    off = ProxyAccess(AclSettings(False), a.audit)
    assert off.allows(alice, WRITE, TOPIC, "x")  # type: ignore[arg-type]
    assert len(out) == n


def test_sasl_failures_reach_the_audit_log() -> None:
    log, out, _ = make_log()
    registry = MetricsRegistry()
    listeners = ProxyListeners(
        [],
        SaslSettings(),
        b"x" * 32,
        BrokerMetrics.create(registry),
        BadInputLog(logging.getLogger("test.audit")),
        audit=log,
    )
    failure = SaslAuthenticationFailed("SCRAM-SHA-256", "client proof mismatch", user="bob")
    listeners._failed(ConnectionInfo("10.0.0.9", 4444, 9097, "SASL"), failure)
    assert out == [
        {
            "v": 1,
            "ts": "2026-11-22T10:30:00.123Z",
            "node": "proxy-101",
            "event": "authentication_failed",
            "principal": "User:ANONYMOUS",
            "peer_host": "10.0.0.9",
            "peer_port": 4444,
            "listener": "SASL",
            "mechanism": "SCRAM-SHA-256",
            "user": "bob",
            "reason": "client proof mismatch",
            "outcome": ErrorCode.sasl_authentication_failed.name.upper(),
            "suppressed": 0,
        }
    ]


def test_no_secret_field_exists() -> None:
    """No event type has a field that could hold a secret."""
    forbidden = {"password", "secret", "token", "salt", "key", "proof", "salted_password"}
    for kind in (
        AuthenticationFailed,
        OperationDenied,
        AclsChanged,
        ScramCredentialsChanged,
        ScramChange,
        AclEntry,
        AuditDropped,
    ):
        names = {f.name for f in dataclasses.fields(kind)}
        assert not names & forbidden, (kind, names & forbidden)
