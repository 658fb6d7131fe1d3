"""ACLs and SCRAM credentials on `zonefleet up --zones 3` through the zone proxies, with
confluent-kafka's AdminClient, kafka-python's KafkaAdminClient and raw requests for the
bindings no client library lets through; both survive a restart of the fleet (issue 5,
"Access lists and credentials"). A lone main without a metadata store keeps them on its WAL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KPResourceType
from kafka.admin import UserScramCredentialUpsertion as KPUpsertion
from kio.schema.errors import ErrorCode

from fleet.config import local_fleet_toml
from s3_commit import FileObjectStore
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.raw_kafka import RawKafka
from tests.zone_fleet import ZoneFleet, start_up_fleet, write_zones_toml, zone_client_id

TIMEOUT = 30


@dataclass
class Running:
    data_dir: Path
    config: Path
    proc: FleetProcess
    fleet: ZoneFleet

    def restart(self) -> None:
        assert self.proc.stop() == 0, "".join(self.proc.output[-40:])
        self.proc, self.fleet = start_up_fleet(self.data_dir, config=self.config)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    data_dir = tmp_path_factory.mktemp("security")
    path, _ = write_zones_toml(data_dir)
    proc, fleet = start_up_fleet(data_dir, config=path)
    run = Running(data_dir, path, proc, fleet)
    try:
        yield run
    finally:
        run.proc.stop()


def _admin(run: Running, zone: str) -> AdminClient:
    return AdminClient(
        {"bootstrap.servers": run.fleet.bootstrap(zone), "client.id": zone_client_id(zone)}
    )


def _binding(name: str, **kw: Any) -> AclBinding:
    args: dict[str, Any] = {
        "restype": ResourceType.TOPIC,
        "name": name,
        "resource_pattern_type": ResourcePatternType.LITERAL,
        "principal": "User:alice",
        "host": "*",
        "operation": AclOperation.READ,
        "permission_type": AclPermissionType.ALLOW,
    }
    args.update(kw)
    return AclBinding(**args)


def _any_filter(**kw: Any) -> AclBindingFilter:
    args: dict[str, Any] = {
        "restype": ResourceType.ANY,
        "name": None,
        "resource_pattern_type": ResourcePatternType.ANY,
        "principal": None,
        "host": None,
        "operation": AclOperation.ANY,
        "permission_type": AclPermissionType.ANY,
    }
    args.update(kw)
    return AclBindingFilter(**args)


def _describe(admin: AdminClient, f: AclBindingFilter) -> set[AclBinding]:
    return set(admin.describe_acls(f).result(timeout=TIMEOUT))


def _users(admin: AdminClient, users: list[str]) -> dict[str, Any]:
    """user -> the future of its description."""
    return cast(dict[str, Any], admin.describe_user_scram_credentials(users))


def _infos(admin: AdminClient, user: str) -> list[tuple[Any, int]]:
    desc = _users(admin, [user])[user].result(timeout=TIMEOUT)
    return sorted((i.mechanism, i.iterations) for i in desc.scram_credential_infos)


def _raw(run: Running, zone: str) -> RawKafka:
    return RawKafka(run.fleet.bootstrap(zone))


# -- ACLs ---------------------------------------------------------------------------------------


def test_acls_created_in_zone_1_are_described_and_deleted_in_other_zones(run: Running) -> None:
    tag = uuid.uuid4().hex[:6]
    created = [
        _binding(f"{tag}-orders"),
        _binding(f"{tag}-orders", operation=AclOperation.WRITE, host="10.0.0.1"),
        _binding(f"{tag}-ord", resource_pattern_type=ResourcePatternType.PREFIXED),
        _binding("*", principal=f"User:bob-{tag}", permission_type=AclPermissionType.DENY),
        _binding(f"g-{tag}", restype=ResourceType.GROUP, operation=AclOperation.DESCRIBE),
        _binding(
            "kafka-cluster",
            restype=ResourceType.BROKER,  # librdkafka's name for CLUSTER (4)
            principal=f"User:admin-{tag}",
            operation=AclOperation.ALTER,
        ),
    ]
    az1, az2, az3 = (_admin(run, z) for z in ("az1", "az2", "az3"))
    for future in az1.create_acls(created).values():
        assert future.result(timeout=TIMEOUT) is None
    # Creating again is no error and no duplicate.
    for future in az1.create_acls(created[:1]).values():
        assert future.result(timeout=TIMEOUT) is None

    everything = _describe(az3, _any_filter())
    assert set(created) <= everything
    assert len([b for b in everything if b == created[0]]) == 1
    # LITERAL filter on a name: only that exact pattern.
    literal = _any_filter(
        restype=ResourceType.TOPIC,
        name=f"{tag}-orders",
        resource_pattern_type=ResourcePatternType.LITERAL,
    )
    assert _describe(az3, literal) == set(created[:2])
    # MATCH: every pattern that applies to the topic (its literal, the prefix, the wildcard).
    match = _any_filter(
        restype=ResourceType.TOPIC,
        name=f"{tag}-orders",
        resource_pattern_type=ResourcePatternType.MATCH,
    )
    got = _describe(az2, match)
    assert set(created[:4]) <= got
    assert created[4] not in got and created[5] not in got
    # Principal, host, operation and permission filters.
    assert _describe(az2, _any_filter(principal=f"User:bob-{tag}")) == {created[3]}
    assert _describe(az2, _any_filter(host="10.0.0.1", name=f"{tag}-orders")) == {created[1]}
    by_op = _describe(az2, _any_filter(operation=AclOperation.ALTER))
    assert created[5] in by_op and all(b.operation == AclOperation.ALTER for b in by_op)

    # Delete through zone 2, check through zone 3.
    results = az2.delete_acls([literal, _any_filter(principal=f"User:bob-{tag}")])
    deleted = [set(f.result(timeout=TIMEOUT)) for f in results.values()]
    assert sorted(deleted, key=len) == sorted([set(created[:2]), {created[3]}], key=len)
    left = _describe(az3, _any_filter())
    assert not set(created[:2]) & left and created[3] not in left
    assert set(created[2:3] + created[4:]) <= left
    # A filter that matches nothing deletes nothing.
    (none,) = az3.delete_acls([_any_filter(principal=f"User:nobody-{tag}")]).values()
    assert none.result(timeout=TIMEOUT) == []


def test_kafka_python_acls_through_a_proxy(run: Running) -> None:
    tag = uuid.uuid4().hex[:6]
    admin = KafkaAdminClient(
        bootstrap_servers=run.fleet.bootstrap("az2"), client_id=zone_client_id("az2")
    )
    try:
        acls = [
            ACL(
                f"User:carol-{tag}",
                "*",
                ACLOperation.WRITE,
                ACLPermissionType.ALLOW,
                ResourcePattern(KPResourceType.TOPIC, f"kp-{tag}", ACLResourcePatternType.LITERAL),
            ),
            ACL(
                f"User:carol-{tag}",
                "*",
                ACLOperation.READ,
                ACLPermissionType.ALLOW,
                ResourcePattern(KPResourceType.GROUP, "kp", ACLResourcePatternType.PREFIXED),
            ),
        ]
        result = admin.create_acls(acls)
        assert len(result["succeeded"]) == 2 and not result["failed"], result
        flt = ACLFilter(
            f"User:carol-{tag}",
            None,
            ACLOperation.ANY,
            ACLPermissionType.ANY,
            ResourcePatternFilter(KPResourceType.ANY, None, ACLResourcePatternType.ANY),
        )
        found, error = admin.describe_acls(flt)
        assert error.errno == 0
        assert {(a.resource_pattern.resource_name, a.operation) for a in found} == {
            (f"kp-{tag}", ACLOperation.WRITE),
            ("kp", ACLOperation.READ),
        }
        ((_, matched, err),) = admin.delete_acls([flt])
        assert err.errno == 0 and len(matched) == 2
        found, _ = admin.describe_acls(flt)
        assert found == []
    finally:
        admin.close()
    # confluent-kafka in zone 1 sees them gone too.
    assert _describe(_admin(run, "az1"), _any_filter(principal=f"User:carol-{tag}")) == set()


def _creation(**kw: Any) -> dict[str, Any]:
    c = {
        "resource_type": 2,
        "resource_name": "t",
        "resource_pattern_type": 3,
        "principal": "User:x",
        "host": "*",
        "operation": 3,
        "permission_type": 3,
    }
    c.update(kw)
    return c


def test_invalid_bindings_get_kafkas_errors(run: Running) -> None:
    raw = _raw(run, "az3")
    try:
        bad = [
            (_creation(resource_type=1), "Invalid resourceType ANY"),
            (_creation(resource_type=99), "Invalid resourceType UNKNOWN"),
            (_creation(resource_pattern_type=2), "Invalid patternType MATCH"),
            (_creation(operation=1), "Invalid operation ANY"),
            (_creation(permission_type=1), "Invalid permissionType ANY"),
            (_creation(principal="alice"), "Could not parse principal from `alice`"),
            (_creation(resource_type=4, resource_name="c"), "The only valid name for the CLUSTER"),
            (_creation(resource_name=""), "Invalid empty resource name"),
        ]
        good = _creation(resource_name=f"good-{uuid.uuid4().hex[:6]}")
        resp = raw.request(30, 3, {"creations": [c for c, _ in bad] + [good]})
        assert len(resp.results) == len(bad) + 1
        for (_, message), result in zip(bad, resp.results[:-1], strict=True):
            assert result.error_code == ErrorCode.invalid_request
            assert result.error_message is not None and message in result.error_message
        assert resp.results[-1].error_code == ErrorCode.none
        # DeleteAcls: a filter with a code outside an enum is INVALID_REQUEST, the rest run.
        del_filter = {
            "resource_type_filter": 2,
            "resource_name_filter": good["resource_name"],
            "pattern_type_filter": 1,
            "principal_filter": None,
            "host_filter": None,
            "operation": 1,
            "permission_type": 1,
        }
        resp = raw.request(
            31, 3, {"filters": [{**del_filter, "resource_type_filter": 42}, del_filter]}
        )
        first, second = resp.filter_results
        assert first.error_code == ErrorCode.invalid_request
        assert first.error_message == "Unknown patternFilter."
        assert second.error_code == ErrorCode.none and len(second.matching_acls) == 1
        assert second.matching_acls[0].resource_name == good["resource_name"]
    finally:
        raw.close()
    # An exact UNKNOWN (0) code: Kafka cannot parse the request and closes the connection.
    for key, body in (
        (30, {"creations": [_creation(resource_type=0)]}),
        (29, {**del_filter, "operation": 0}),
        (31, {"filters": [{**del_filter, "permission_type": 0}]}),
    ):
        raw = _raw(run, "az1")
        try:
            with pytest.raises(AssertionError, match="connection closed"):
                raw.request(key, 3, body)
        finally:
            raw.close()


# -- SCRAM --------------------------------------------------------------------------------------


def _scram_doc(run: Running) -> dict[str, Any]:
    url = next(m.broker.metadata_url for m in run.fleet.config.mains)
    assert url is not None and url.startswith("file://")
    path = Path(url[7:]) / "cluster" / "scram.json"
    if not path.exists():
        return {"users": {}}
    data: dict[str, Any] = json.loads(path.read_bytes())
    return data


def test_scram_credentials_through_proxies(run: Running) -> None:
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    salt = b"0123456789abcdef"
    az1, az3 = _admin(run, "az1"), _admin(run, "az3")
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    futures = az1.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(alice, sha256, b"alice-secret", salt),
            UserScramCredentialUpsertion(bob, sha512, b"bob-secret"),
        ]
    )
    for f in futures.values():
        assert f.result(timeout=TIMEOUT) is None
    # The second mechanism for alice, in another request.
    (f,) = az1.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(alice, sha512, b"alice-512")]
    ).values()
    assert f.result(timeout=TIMEOUT) is None

    described = _users(az3, [alice, bob])
    got = {
        user: sorted(
            (i.mechanism, i.iterations) for i in fut.result(timeout=TIMEOUT).scram_credential_infos
        )
        for user, fut in described.items()
    }
    assert got == {
        alice: sorted([(ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 8192)]),
        bob: [(ScramMechanism.SCRAM_SHA_512, 8192)],
    }
    everyone = cast(Any, az3.describe_user_scram_credentials()).result(timeout=TIMEOUT)
    assert {alice, bob} <= set(everyone)

    # What is stored: salt, iterations, StoredKey and ServerKey of the salted password; no
    # password, and no salted password.
    entry = _scram_doc(run)["users"][alice]["SCRAM-SHA-256"]
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-secret", salt, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert base64.b64decode(entry["salt"]) == salt and entry["iterations"] == 4096
    assert base64.b64decode(entry["stored_key"]) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(entry["server_key"]) == hmac.digest(salted, b"Server Key", "sha256")
    text = json.dumps(_scram_doc(run))
    assert "alice-secret" not in text and base64.b64encode(salted).decode() not in text

    # Deleting one mechanism keeps the other.
    (f,) = az3.alter_user_scram_credentials(
        [UserScramCredentialDeletion(alice, ScramMechanism.SCRAM_SHA_256)]
    ).values()
    assert f.result(timeout=TIMEOUT) is None
    assert _infos(az1, alice) == [(ScramMechanism.SCRAM_SHA_512, 8192)]


def _error_code(exc: BaseException) -> int:
    assert isinstance(exc, KafkaException), exc
    err = exc.args[0]
    assert isinstance(err, KafkaError)
    return int(err.code())


def test_scram_errors(run: Running) -> None:
    user = f"erin-{uuid.uuid4().hex[:6]}"
    admin = _admin(run, "az2")
    # Unknown user in a describe.
    fut = _users(admin, [user])[user]
    with pytest.raises(KafkaException) as info:
        fut.result(timeout=TIMEOUT)
    assert _error_code(info.value) == ErrorCode.resource_not_found
    # Too few and too many iterations.
    for iterations in (4095, 16385):
        info_ = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, iterations)
        (f,) = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, info_, b"pw")]
        ).values()
        with pytest.raises(KafkaException) as info:
            f.result(timeout=TIMEOUT)
        assert _error_code(info.value) == ErrorCode.unacceptable_credential
    # Deleting a credential that does not exist.
    (f,) = admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)]
    ).values()
    with pytest.raises(KafkaException) as info:
        f.result(timeout=TIMEOUT)
    assert _error_code(info.value) == ErrorCode.resource_not_found

    # Raw: an unknown mechanism, a user twice in one request, one named twice in a describe.
    raw = _raw(run, "az1")
    try:
        upsert = {
            "name": user,
            "mechanism": 1,
            "iterations": 4096,
            "salt": b"s",
            "salted_password": b"p" * 32,
        }
        resp = raw.request(
            51,
            0,
            {
                "deletions": [{"name": f"{user}-x", "mechanism": 7}],
                "upsertions": [upsert, {**upsert, "mechanism": 2}],
            },
        )
        codes = {r.user: r.error_code for r in resp.results}
        assert codes == {
            f"{user}-x": ErrorCode.unsupported_sasl_mechanism,
            user: ErrorCode.duplicate_resource,
        }
        resp = raw.request(50, 0, {"users": [{"name": user}, {"name": user}]})
        ((result),) = resp.results
        assert result.error_code == ErrorCode.duplicate_resource
    finally:
        raw.close()
    # Nothing of that was stored.
    assert user not in _scram_doc(run)["users"]


def test_kafka_python_scram(run: Running) -> None:
    user = f"kp-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(
        bootstrap_servers=run.fleet.bootstrap("az3"), client_id=zone_client_id("az3")
    )
    try:
        result = admin.alter_user_scram_credentials(
            [KPUpsertion(user, "SCRAM-SHA-512", "pw", iterations=10000)]
        )
        assert result == {user: None}
        described = admin.describe_user_scram_credentials([user])
        assert described[user]["error"] is None
        ((info),) = described[user]["credential_infos"]
        assert int(info["mechanism"]) == 2 and info["iterations"] == 10000
    finally:
        admin.close()


# -- restart ------------------------------------------------------------------------------------


def test_acls_and_credentials_survive_a_fleet_restart(run: Running) -> None:
    tag = uuid.uuid4().hex[:6]
    binding = _binding(f"durable-{tag}", principal=f"User:dora-{tag}")
    user = f"dora-{tag}"
    az2 = _admin(run, "az2")
    for f in az2.create_acls([binding]).values():
        assert f.result(timeout=TIMEOUT) is None
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 5000)
    (f,) = az2.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, b"pw")]
    ).values()
    assert f.result(timeout=TIMEOUT) is None
    before = _describe(az2, _any_filter())

    run.restart()

    for zone in run.fleet.zones:
        admin = _admin(run, zone)
        assert _describe(admin, _any_filter()) == before
        assert _infos(admin, user) == [(ScramMechanism.SCRAM_SHA_256, 5000)]


def test_a_corrupt_document_gets_an_error_code_and_is_not_overwritten(run: Running) -> None:
    url = next(m.broker.metadata_url for m in run.fleet.config.mains)
    assert url is not None and url.startswith("file://")
    store = FileObjectStore(url[7:])
    saved = {key: store.get(key) for key in ("cluster/acls.json", "cluster/scram.json")}
    try:
        for key in saved:
            store.put(key, b'{"format":1,"version":"x"')
        raw = _raw(run, "az2")
        try:
            resp = raw.request(
                29,
                3,
                {
                    "resource_type_filter": 1,
                    "resource_name_filter": None,
                    "pattern_type_filter": 1,
                    "principal_filter": None,
                    "host_filter": None,
                    "operation": 1,
                    "permission_type": 1,
                },
            )
            assert resp.error_code == ErrorCode.unknown_server_error and resp.resources == ()
            resp = raw.request(30, 3, {"creations": [_creation(resource_name="c")]})
            assert resp.results[0].error_code == ErrorCode.unknown_server_error
            resp = raw.request(50, 0, {"users": None})
            assert resp.error_code == ErrorCode.unknown_server_error
            upsert = {"name": "u", "mechanism": 1, "iterations": 4096, "salted_password": b"p"}
            resp = raw.request(51, 0, {"deletions": [], "upsertions": [upsert]})
            assert [(r.user, r.error_code) for r in resp.results] == [
                ("u", ErrorCode.unknown_server_error)
            ]
        finally:
            raw.close()
        for key in saved:
            found = store.get(key)
            assert found is not None and found[0] == b'{"format":1,"version":"x"'
    finally:
        for key, found in saved.items():
            if found is None:
                store.delete_many([key])
            else:
                store.put(key, found[0])


# -- a lone main --------------------------------------------------------------------------------


def test_lone_main_keeps_acls_and_credentials_on_its_wal(tmp_path: Path) -> None:
    """One main and no [metadata]: the documents go to its WAL and come back after a restart."""
    data_dir = tmp_path / "lone"
    data_dir.mkdir()
    base = free_port_block(4)
    text = local_fleet_toml(data_dir, base)
    text, count = re.subn(r'(?m)^\[metadata\]\nurl = ".*"\n', "", text)
    assert count == 1
    path = data_dir / "fleet.toml"
    path.write_text(text)
    binding = _binding("lone-topic", principal="User:lone")

    def start() -> FleetProcess:
        return FleetProcess(data_dir, base, ["--config", str(path)]).start()

    proc = start()
    try:
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        for f in admin.create_acls([binding]).values():
            assert f.result(timeout=TIMEOUT) is None
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        (f,) = admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("lone", info, b"pw")]
        ).values()
        assert f.result(timeout=TIMEOUT) is None
    finally:
        assert proc.stop() == 0, "".join(proc.output[-40:])
    assert not (data_dir / "metadata").exists()

    proc = start()
    try:
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        assert _describe(admin, _any_filter()) == {binding}
        assert _infos(admin, "lone") == [(ScramMechanism.SCRAM_SHA_512, 4096)]
    finally:
        proc.stop()
