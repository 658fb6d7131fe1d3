"""S3 faults: moto's server behind a proxy that throttles, fails, drops answers and stalls."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from s3_commit import ConditionalPutUnknown, ObjectStoreError, PreconditionFailed
from s3_commit.retry import RetryPolicy
from s3_commit.s3_store import MIN_PART_SIZE, S3ObjectStore
from tests.ports import free_port
from tests.s3_servers import (
    Fault,
    FaultProxy,
    MotoServer,
    fault_proxy,
    moto,
    raw_client,
)

__all__ = ["fault_proxy", "moto"]  # fixtures, imported so pytest finds them

SLOW_DOWN = Fault(status=503, code="SlowDown")
INTERNAL = Fault(status=500, code="InternalError")


class Pauses:
    """Stands in for time.sleep: records the backoff and can act between attempts."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.between: Any = None

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.between is not None:
            self.between()


def _store(
    moto: MotoServer, proxy: FaultProxy, *, attempts: int = 5, **options: Any
) -> tuple[S3ObjectStore, Pauses, Counter[str]]:
    pauses = Pauses()
    ops: Counter[str] = Counter()
    store = moto.store(
        endpoint=proxy.endpoint,
        retry_policy=RetryPolicy(max_attempts=attempts, base_delay_s=0.001, max_delay_s=0.004),
        sleep=pauses,
        **options,
    )
    store.traffic_hook = lambda op, nbytes: ops.update([op])
    return store, pauses, ops


def test_throttling_and_5xx_are_retried_within_the_bound(
    moto: MotoServer, fault_proxy: FaultProxy
) -> None:
    store, pauses, ops = _store(moto, fault_proxy, attempts=5)
    fault_proxy.inject(SLOW_DOWN, 2)
    fault_proxy.inject(INTERNAL)
    fault_proxy.inject(Fault(status=503, code="RequestLimitExceeded"))
    etag = store.put("a", b"payload")
    assert fault_proxy.injected == 4 and len(pauses.delays) == 4
    # Full jitter under an exponential cap: 1, 2, 4, 4 ms at most.
    caps = [0.001, 0.002, 0.004, 0.004]
    assert all(0 <= d <= cap for d, cap in zip(pauses.delays, caps, strict=True))
    assert ops["PutObject"] == 5  # every answered attempt is a request

    fault_proxy.inject(INTERNAL, 2)
    assert store.get("a") == (b"payload", etag)
    fault_proxy.inject(Fault(status=500, code="InternalError", method="GET"))
    assert store.get_range("a", 3, 4) == b"load"
    fault_proxy.inject(SLOW_DOWN)
    assert [o.key for o in store.list()] == ["a"]
    fault_proxy.inject(SLOW_DOWN)
    store.delete_many(["a"])
    assert store.head("a") is None


def test_the_bound_is_honoured(moto: MotoServer, fault_proxy: FaultProxy) -> None:
    store, pauses, _ = _store(moto, fault_proxy, attempts=3)
    fault_proxy.inject(SLOW_DOWN, 10)
    with pytest.raises(ObjectStoreError, match=r"put a: gave up after 3 attempts: SlowDown"):
        store.put("a", b"x")
    assert fault_proxy.injected == 3 and len(pauses.delays) == 2
    fault_proxy.clear()

    # Not retriable: one attempt, a clear error.
    fault_proxy.inject(Fault(status=403, code="AccessDenied"))
    with pytest.raises(ObjectStoreError, match=r"get a: AccessDenied \(HTTP 403\)"):
        store.get("a")
    assert fault_proxy.injected == 4

    # A dead endpoint: connection errors are retried, then reported.
    dead = moto.store(
        endpoint=f"http://127.0.0.1:{free_port()}",
        retry_policy=RetryPolicy(max_attempts=2, base_delay_s=0.001),
        connect_timeout_s=0.5,
    )
    with pytest.raises(ObjectStoreError, match="gave up after 2 attempts") as raised:
        dead.put("doc", b"x", if_none_match=True)
    # Nothing was sent, so the conditional put's outcome is known: it did not happen.
    assert not isinstance(raised.value, ConditionalPutUnknown)


def test_conflict_answers_are_precondition_failures(
    moto: MotoServer, fault_proxy: FaultProxy
) -> None:
    store, _, _ = _store(moto, fault_proxy)
    fault_proxy.inject(Fault(status=409, code="ConditionalRequestConflict"))
    with pytest.raises(PreconditionFailed):
        store.put("doc", b"x", if_none_match=True)
    assert store.get("doc") is None


@pytest.mark.parametrize("replace", [False, True])
def test_conditional_put_whose_answer_was_lost_resolves_to_success(
    moto: MotoServer, fault_proxy: FaultProxy, replace: bool
) -> None:
    store, pauses, ops = _store(moto, fault_proxy)
    etag = store.put("doc", b"v1") if replace else None
    # The write reaches moto, the answer never reaches us; the retry then gets 412.
    fault_proxy.inject(Fault(drop=True, method="PUT"))
    new = store.put("doc", b"v2", if_match=etag, if_none_match=not replace)
    assert fault_proxy.injected == 1 and len(pauses.delays) == 1
    assert ops["HeadObject"] == 1  # the 412 was resolved by reading our token back
    assert store.get("doc") == (b"v2", new)


def test_conditional_put_with_unknown_outcome_is_not_a_plain_conflict(
    moto: MotoServer, fault_proxy: FaultProxy
) -> None:
    store, pauses, _ = _store(moto, fault_proxy)
    raw = raw_client(moto.endpoint)
    # Our create lands unheard; before the retry another writer replaces it.
    pauses.between = lambda: raw.put_object(
        Bucket=store.bucket, Key=f"{store.prefix}/doc", Body=b"theirs"
    )
    fault_proxy.inject(Fault(drop=True, method="PUT"))
    with pytest.raises(ConditionalPutUnknown, match="may or may not have landed"):
        store.put("doc", b"ours", if_none_match=True)
    # PreconditionFailed would have told the caller to re-apply its change on top of itself.
    assert not isinstance(ConditionalPutUnknown("x"), PreconditionFailed)


def test_slow_endpoint(moto: MotoServer, fault_proxy: FaultProxy) -> None:
    store, pauses, _ = _store(moto, fault_proxy, read_timeout_s=0.5)
    store.put("a", b"x" * 1000)
    fault_proxy.inject(Fault(delay_s=0.2))  # slow but inside the timeout: no retry
    assert store.get_range("a", 0, 3) == b"xxx"
    assert pauses.delays == []
    fault_proxy.inject(Fault(delay_s=1.0, method="GET"))  # past the timeout: retried
    assert store.get_range("a", 0, 3) == b"xxx"
    assert len(pauses.delays) == 1


def test_multipart_parts_are_retried(moto: MotoServer, fault_proxy: FaultProxy) -> None:
    store, _, ops = _store(
        moto, fault_proxy, multipart_threshold=MIN_PART_SIZE, part_size=MIN_PART_SIZE
    )
    data = b"m" * (MIN_PART_SIZE + 10)
    fault_proxy.inject(Fault(status=503, code="SlowDown", path_contains="partNumber="), 2)
    etag = store.put("big", data)
    assert fault_proxy.injected == 2 and ops["UploadPart"] == 4
    assert store.get("big") == (data, etag)
    # The answer to CompleteMultipartUpload is lost. moto completes the same upload again
    # (S3 may too); a server that answers NoSuchUpload or 412 instead is resolved by reading
    # our token back. Either way the put succeeds, and nothing is written twice.
    fault_proxy.inject(Fault(drop=True, method="POST", path_contains="uploadId="))
    etag2 = store.put("big2", data, if_none_match=True)
    assert fault_proxy.injected == 3 and ops["CompleteMultipartUpload"] == 2
    assert store.get("big2") == (data, etag2)
