"""The ACL and SCRAM documents: golden bytes (docs/formats.md), and both places a main keeps
them (main_broker/security/doc_store.py): the object store by compare-and-swap, a lone main's
WAL."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import trio

from kafka_wire.acl.rules import AclBinding
from kafka_wire.quotas.entities import DEFAULT, QuotaEntity
from kafka_wire.sasl.scram import server_key, stored_key
from kafka_wire.security_docs import AclsDoc, QuotasDoc, ScramDoc, SecurityDocError
from main_broker.security.doc_store import ObjectDocuments, WalDocuments
from main_broker.security.scram import derive_credential
from s3_commit import AsyncObjectStore, FileObjectStore
from shared_wal import WalConfig
from shared_wal import broker_records as wal_records
from tests.test_log_store import _open, _produce

ORDERS = AclBinding(2, "orders", 3, "User:alice", "*", 3, 3)
CLUSTER = AclBinding(4, "kafka-cluster", 3, "User:admin", "10.0.0.1", 2, 2)


def test_acls_doc_golden_bytes_and_round_trip() -> None:
    doc = AclsDoc().with_acls([CLUSTER, ORDERS])
    assert doc.to_bytes() == (
        b'{"format":1,"version":1,"acls":[[2,"orders",3,"User:alice","*",3,3],'
        b'[4,"kafka-cluster",3,"User:admin","10.0.0.1",2,2]]}'
    )
    assert AclsDoc.from_bytes(doc.to_bytes()) == doc
    assert doc.with_acls([ORDERS]) is doc  # nothing new: same version, no write
    less = doc.without_acls([ORDERS])
    assert less.version == 2 and less.acls == frozenset({CLUSTER})
    assert less.without_acls([ORDERS]) is less


def test_scram_doc_golden_bytes_and_round_trip() -> None:
    cred = derive_credential(b"salt", b"k" * 32, 4096, 1)
    assert cred.stored_key == stored_key(b"k" * 32, "sha256")
    assert cred.server_key == server_key(b"k" * 32, "sha256")
    doc = ScramDoc().with_credentials({("alice", 1): cred})
    assert doc.to_bytes() == (
        b'{"format":1,"version":1,"users":{"alice":{"SCRAM-SHA-256":{"salt":"c2FsdA==",'
        b'"stored_key":"kh6yMIHqRz7w57Ha8FeNHmX0Pd/RohdGm+inEY1xbtA=",'
        b'"server_key":"9o0C0GJyrm25x1PB1M9IJ0ax+/98iDYjudh2DUZ+XaM=","iterations":4096}}}}'
    )
    assert ScramDoc.from_bytes(doc.to_bytes()) == doc
    assert doc.with_credentials({("alice", 1): cred}) is doc


def test_quotas_doc_golden_bytes_and_round_trip() -> None:
    doc = QuotasDoc().with_quotas(
        {
            QuotaEntity("alice", DEFAULT): {"producer_byte_rate": 1048576.0},
            QuotaEntity(None, "greedy"): {
                "producer_byte_rate": 524288.0,
                "consumer_byte_rate": 1048576.0,
            },
            QuotaEntity(DEFAULT): {"request_percentage": 12.5},
        }
    )
    assert doc.to_bytes() == (
        b'{"format":1,"version":1,"quotas":['
        b'[{"client-id":"greedy"},{"consumer_byte_rate":1048576,"producer_byte_rate":524288}],'
        b'[{"user":"alice","client-id":null},{"producer_byte_rate":1048576}],'
        b'[{"user":null},{"request_percentage":12.5}]]}'
    )
    assert QuotasDoc.from_bytes(doc.to_bytes()) == doc
    assert QuotasDoc.from_bytes(doc.to_bytes()).to_bytes() == doc.to_bytes()
    assert doc.with_quotas(doc.quotas) is doc
    assert doc.with_quotas({}).version == 2
    assert QuotasDoc.parse(None) == QuotasDoc()


@pytest.mark.parametrize(
    "bad",
    [
        b'{"format":1,"version":1,"quotas":[[{"user":"a"},{"producer_byte_rate":0}]]}',
        b'{"format":1,"version":1,"quotas":[[{"user":"a"},{"producer_byte_rate":"1"}]]}',
        b'{"format":1,"version":1,"quotas":[[{"group":"a"},{"producer_byte_rate":1}]]}',
        b'{"format":1,"version":1,"quotas":[[{"user":1},{"producer_byte_rate":1}]]}',
        b'{"format":1,"version":1,"quotas":[[{"user":"a"},{}],[{"user":"a"},{}]]}',
        b'{"format":1,"version":1,"quotas":{}}',
    ],
)
def test_corrupt_quotas_documents_are_refused(bad: bytes) -> None:
    with pytest.raises(SecurityDocError):
        QuotasDoc.from_bytes(bad)


@pytest.mark.parametrize(
    "bad",
    [
        b"{",
        b"[]",
        b'{"format":2,"version":1,"acls":[]}',
        b'{"format":1,"acls":[]}',
        b'{"format":1,"version":1,"acls":[[2,"t",3,"User:a","*",3]]}',
        b'{"format":1,"version":1,"acls":[["2","t",3,"User:a","*",3,3]]}',
    ],
)
def test_corrupt_acl_documents_are_refused(bad: bytes) -> None:
    with pytest.raises(SecurityDocError):
        AclsDoc.from_bytes(bad)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"format":1,"version":1,"users":{"a":{"SCRAM-SHA-1":{}}}}',
        b'{"format":1,"version":1,"users":{"a":{"SCRAM-SHA-256":{"salt":"!!","stored_key":"",'
        b'"server_key":"","iterations":4096}}}}',
        b'{"format":1,"version":1,"users":{"a":{"SCRAM-SHA-256":{"salt":"","stored_key":"",'
        b'"server_key":"","iterations":"4096"}}}}',
        b'{"format":1,"version":1,"users":[]}',
    ],
)
def test_corrupt_scram_documents_are_refused(bad: bytes) -> None:
    with pytest.raises(SecurityDocError):
        ScramDoc.from_bytes(bad)


def test_golden_document_control_record_header() -> None:
    header = wal_records.document_header("acls", b'{"x":1}')
    assert msgpack.packb(header, use_bin_type=True).hex() == (
        "83a16ba3646f63a16ea461636c73a162c4077b2278223a317d"
    )


async def test_object_documents_concurrent_writers_from_two_mains(tmp_path: Path) -> None:
    """Two mains (two stores over one bucket) adding ACLs at once: every change lands once."""
    mains = [ObjectDocuments(AsyncObjectStore(FileObjectStore(tmp_path))) for _ in range(2)]
    assert await mains[0].load("acls") is None

    async def add(docs: ObjectDocuments, who: int) -> None:
        for i in range(15):
            binding = AclBinding(2, f"t{who}-{i}", 3, "User:a", "*", 3, 3)

            def change(data: bytes | None, b: AclBinding = binding) -> bytes | None:
                doc = AclsDoc() if data is None else AclsDoc.from_bytes(data)
                return doc.with_acls([b]).to_bytes()

            await docs.update("acls", change)

    async with trio.open_nursery() as nursery:
        for who, docs in enumerate(mains):
            nursery.start_soon(add, docs, who)
    stored = await mains[1].load("acls")
    assert stored is not None
    doc = AclsDoc.from_bytes(stored)
    assert len(doc.acls) == 30 and doc.version == 30
    assert (tmp_path / "cluster" / "acls.json").read_bytes() == stored
    # A change that returns None writes nothing.
    assert await mains[0].update("acls", lambda data: None) == stored


async def test_wal_documents_survive_restart_and_retention(tmp_path: Path) -> None:
    """A lone main's documents come back from its WAL: from the CONTROL record, and from the
    SNAPSHOT of the oldest segment once retention deleted the segment that held the record."""
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=4096, retention_bytes=8192)
    store, wal = await _open(url, config)
    acls = AclsDoc().with_acls([ORDERS]).to_bytes()
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        docs = WalDocuments(store)
        await docs.update("acls", lambda data: acls)
        await docs.update("scram", lambda data: b"first")
        await docs.update("scram", lambda data: (data or b"") + b"+second")
        store2, wal2 = await _open(url, config)  # read back while the first still runs
        assert store2.documents == {"acls": acls, "scram": b"first+second"}
        await wal2.aclose()
        await store.create_topic("r", 1, {})
        for i in range(60):
            await _produce(store, "r", 0, [f"x{i:03}".encode() * 40])
        assert await wal.enforce_retention(), "retention should have deleted old segments"
        assert min(wal.segments()) > 0, "the segment with the CONTROL records is gone"
        await wal.aclose()
        nursery.cancel_scope.cancel()
    store3, wal3 = await _open(url, config)
    assert store3.documents == {"acls": acls, "scram": b"first+second"}
    assert await WalDocuments(store3).load("acls") == acls
    await wal3.aclose()
