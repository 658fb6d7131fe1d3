"""The `s3://bucket/prefix` object store, through boto3.

Retries are ours, not botocore's (its own are switched off), so the policy is explicit: bounded
attempts with jittered exponential backoff on throttling, 5xx and connection errors.

A conditional put is never retried blindly. Each put carries a random token in its user
metadata (`x-amz-meta-zf-put-id`). When an attempt failed in a way that hides whether S3 applied
it (a timeout, a dropped connection, a 500) and a retry then gets 412, the store reads the
object's token back: our token means our write landed (success), anything else means the
outcome cannot be known (`ConditionalPutUnknown`), never a plain PreconditionFailed that would
make the caller apply its change a second time.
"""

from __future__ import annotations

import builtins
import functools
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from s3_commit.object_store import (
    ConditionalPutUnknown,
    ObjectInfo,
    ObjectStoreError,
    PreconditionFailed,
    TrafficHook,
)
from s3_commit.retry import RetriesExhausted, RetryPolicy, call_with_retries

__all__ = [
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "S3ObjectStore",
    "is_retriable",
    "may_have_applied",
]

T = TypeVar("T")

MIB: Final = 1 << 20
MIN_PART_SIZE: Final = 5 * MIB  # S3's minimum for every part but the last
MAX_PARTS: Final = 10_000
DEFAULT_PART_SIZE: Final = 16 * MIB
DEFAULT_MULTIPART_THRESHOLD: Final = 16 * MIB
MAX_DELETE_BATCH: Final = 1000  # DeleteObjects takes at most 1000 keys
MAX_LIST_PAGE: Final = 1000
TOKEN_META: Final = "zf-put-id"

THROTTLE_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
    }
)
# Rejected before anything was applied, so a write may be retried as it is.
_NOT_APPLIED_CODES: Final = THROTTLE_CODES | {"RequestTimeout"}
_RETRIABLE_CODES: Final = _NOT_APPLIED_CODES | {"InternalError", "ServiceUnavailable"}


def _status(exc: ClientError) -> int:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_retriable(exc: BaseException) -> bool:
    """Throttling, 5xx, timeouts and connection errors: worth another attempt."""
    if isinstance(exc, ClientError):
        status = _status(exc)
        return _code(exc) in _RETRIABLE_CODES or status >= 500 or status == 429
    return isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError))


def may_have_applied(exc: BaseException) -> bool:
    """Whether a write that failed with `exc` might nevertheless have been applied."""
    if isinstance(exc, ClientError):
        return _code(exc) not in _NOT_APPLIED_CODES and _status(exc) != 429
    if isinstance(exc, BotoConnectionError):  # could not connect: nothing was sent
        return False
    return True


def _is_precondition(exc: ClientError, if_match: str | None) -> bool:
    code, status = _code(exc), _status(exc)
    if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
        return True
    # S3 answers If-Match on a missing key with 404 NoSuchKey: the version we read is gone.
    return if_match is not None and (status == 404 or code == "NoSuchKey")


def _is_missing(exc: ClientError) -> bool:
    return _status(exc) == 404 or _code(exc) in ("NoSuchKey", "NotFound", "404")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')} (HTTP {_status(exc)}): {error.get('Message', '')}"
    return f"{type(exc).__name__}: {exc}"


class S3ObjectStore:
    """Objects in `bucket` under `prefix`; see the module docstring.

    `endpoint_url` selects an S3-compatible server (SeaweedFS, moto, MinIO) and then defaults
    to path-style addressing. Credentials not given here come from the usual AWS chain.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        path_style: bool | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        upload_concurrency: int = 4,
        max_attempts: int = 6,
        retry_policy: RetryPolicy | None = None,
        list_page_size: int = MAX_LIST_PAGE,
        delete_batch_size: int = MAX_DELETE_BATCH,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_pool_connections: int = 32,
        traffic_hook: TrafficHook | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum of {MIN_PART_SIZE}")
        if multipart_threshold < 1 or upload_concurrency < 1:
            raise ValueError("multipart_threshold and upload_concurrency must be positive")
        if not 1 <= list_page_size <= MAX_LIST_PAGE:
            raise ValueError(f"list_page_size must be in 1..{MAX_LIST_PAGE}")
        if not 1 <= delete_batch_size <= MAX_DELETE_BATCH:
            raise ValueError(f"delete_batch_size must be in 1..{MAX_DELETE_BATCH}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.upload_concurrency = upload_concurrency
        self.retry_policy = retry_policy or RetryPolicy(max_attempts=max_attempts)
        self.list_page_size = list_page_size
        self.delete_batch_size = delete_batch_size
        self.traffic_hook = traffic_hook
        self._sleep = sleep
        session = boto3.session.Session(
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            aws_session_token=session_token,
            region_name=region,
        )
        if path_style is None:
            path_style = endpoint_url is not None
        config = Config(
            # One attempt per botocore call: the retry loop here owns the policy.
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": "path" if path_style else "auto"},
        )
        # botocore needs a region to sign; S3-compatible servers accept any.
        region_name = session.region_name or ("us-east-1" if endpoint_url else None)
        self.client: Any = session.client(
            "s3", endpoint_url=endpoint_url, region_name=region_name, config=config
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.bucket!r}, {self.prefix!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        if not key:
            raise ObjectStoreError("empty object key")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    def _count(self, op: str, nbytes: int) -> None:
        if self.traffic_hook is not None:
            self.traffic_hook(op, nbytes)

    def _request(self, op: str, nbytes_out: int, call: Callable[[], T]) -> T:
        """One HTTP request, counted once it got an answer (an error answer included)."""
        try:
            result = call()
        except ClientError:
            self._count(op, 0)
            raise
        self._count(op, nbytes_out)
        return result

    def _retry(
        self,
        what: str,
        fn: Callable[[], T],
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        """Run `fn` under the retry policy. Errors that are neither retriable nor ClientErrors
        the caller interprets come out as ObjectStoreError."""
        kwargs: dict[str, Any] = {"on_retry": on_retry}
        if self._sleep is not None:
            kwargs["sleep"] = self._sleep
        try:
            return call_with_retries(fn, self.retry_policy, is_retriable, **kwargs)
        except RetriesExhausted as exc:
            raise ObjectStoreError(
                f"s3://{self.bucket}: {what}: gave up after {exc.attempts} attempts: "
                f"{_describe(exc.last)}"
            ) from exc.last
        except BotoCoreError as exc:
            raise ObjectStoreError(f"s3://{self.bucket}: {what}: {_describe(exc)}") from exc

    def _error(self, what: str, exc: BaseException) -> ObjectStoreError:
        return ObjectStoreError(f"s3://{self.bucket}: {what}: {_describe(exc)}")

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (tests and `zonefleet up` on a fresh server)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        region = self.client.meta.region_name
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._retry(
                "create bucket",
                lambda: self._request(
                    "CreateBucket", 0, lambda: self.client.create_bucket(**kwargs)
                ),
            )
        except ClientError as exc:
            if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._error("create bucket", exc) from exc

    # -- reads --------------------------------------------------------------------------------

    def _get_object(self, key: str, byte_range: str | None) -> tuple[bytes, str] | None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if byte_range is not None:
            kwargs["Range"] = byte_range

        def attempt() -> tuple[bytes, str] | None:
            try:
                response = self.client.get_object(**kwargs)
            except ClientError as exc:
                self._count("GetObject", 0)
                if _is_missing(exc):
                    return None
                if _code(exc) == "InvalidRange":  # the range starts past the end
                    return b"", ""
                raise
            data: bytes = response["Body"].read()
            self._count("GetObject", len(data))
            return data, str(response.get("ETag", ""))

        try:
            return self._retry(f"get {key}", attempt)
        except ClientError as exc:
            raise self._error(f"get {key}", exc) from exc

    def get(self, key: str) -> tuple[bytes, str] | None:
        return self._get_object(key, None)

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        if start < 0 or length <= 0:
            raise ValueError(f"bad range start={start} length={length}")
        found = self._get_object(key, f"bytes={start}-{start + length - 1}")
        return None if found is None else found[0]

    def _head_response(self, key: str) -> dict[str, Any] | None:
        def attempt() -> dict[str, Any] | None:
            try:
                return self._request(
                    "HeadObject",
                    0,
                    lambda: self.client.head_object(Bucket=self.bucket, Key=self._full(key)),
                )
            except ClientError as exc:
                if _is_missing(exc):
                    return None
                raise

        try:
            return self._retry(f"head {key}", attempt)
        except ClientError as exc:
            raise self._error(f"head {key}", exc) from exc

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head_response(key)
        if response is None:
            return None
        return ObjectInfo(key, int(response["ContentLength"]), str(response["ETag"]))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        token: str | None = None
        while True:
            page = self._list_page(prefix, full_prefix, token)
            for entry in page.get("Contents", []):
                yield ObjectInfo(
                    self._relative(entry["Key"]), int(entry["Size"]), str(entry["ETag"])
                )
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def _list_page(self, prefix: str, full_prefix: str, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": full_prefix,
            "MaxKeys": self.list_page_size,
        }
        if token is not None:
            kwargs["ContinuationToken"] = token
        call = functools.partial(self.client.list_objects_v2, **kwargs)
        try:
            return self._retry(f"list {prefix!r}", lambda: self._request("ListObjectsV2", 0, call))
        except ClientError as exc:
            raise self._error(f"list {prefix!r}", exc) from exc

    # -- writes -------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        token = uuid.uuid4().hex
        conditions: dict[str, str] = {}
        if if_none_match:
            conditions["IfNoneMatch"] = "*"
        if if_match is not None:
            conditions["IfMatch"] = if_match
        view = memoryview(data).cast("B")
        if len(view) > self.multipart_threshold:
            return self._put_multipart(key, view, token, conditions, if_match)
        body = data if isinstance(data, bytes) else view.tobytes()
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(key),
            "Body": body,
            "Metadata": {TOKEN_META: token},
            **conditions,
        }
        return self._conditional_write(
            f"put {key}",
            key,
            token,
            if_match,
            bool(conditions),
            lambda: self._request("PutObject", len(body), lambda: self.client.put_object(**kwargs)),
        )

    def _conditional_write(
        self,
        what: str,
        key: str,
        token: str,
        if_match: str | None,
        conditional: bool,
        call: Callable[[], dict[str, Any]],
        *,
        multipart: bool = False,
    ) -> str:
        """The write `call` (PutObject or CompleteMultipartUpload) under the retry policy, with
        outcome resolution when an attempt may have been applied without our seeing it."""
        uncertain: builtins.list[BaseException] = []

        def note(exc: BaseException) -> None:
            if may_have_applied(exc):
                uncertain.append(exc)

        try:
            response = self._retry(what, call, note)
        except ClientError as exc:
            if uncertain and (
                _is_precondition(exc, if_match) or (multipart and _code(exc) == "NoSuchUpload")
            ):
                return self._resolve(what, key, token, uncertain[0], exc)
            if _is_precondition(exc, if_match):
                raise PreconditionFailed(f"{what}: {_describe(exc)}") from exc
            raise self._error(what, exc) from exc
        except ObjectStoreError as exc:
            if uncertain and conditional:
                raise ConditionalPutUnknown(f"{exc} (an earlier attempt may have landed)") from exc
            raise
        return str(response["ETag"])

    def _resolve(
        self, what: str, key: str, token: str, first: BaseException, last: ClientError
    ) -> str:
        response = self._head_response(key)
        if response is not None and response.get("Metadata", {}).get(TOKEN_META) == token:
            return str(response["ETag"])  # the attempt that failed to answer did land
        raise ConditionalPutUnknown(
            f"s3://{self.bucket}: {what}: an attempt failed with {_describe(first)}, then a "
            f"retry got {_describe(last)}; the object holds another write, so ours may or may "
            "not have landed"
        )

    def _put_multipart(
        self,
        key: str,
        view: memoryview,
        token: str,
        conditions: dict[str, str],
        if_match: str | None,
    ) -> str:
        full = self._full(key)
        created = self._retry(
            f"start multipart upload {key}",
            lambda: self._request(
                "CreateMultipartUpload",
                0,
                lambda: self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=full, Metadata={TOKEN_META: token}
                ),
            ),
        )
        upload_id = created["UploadId"]
        part_size = max(self.part_size, math.ceil(len(view) / MAX_PARTS))
        bounds = [(n + 1, start) for n, start in enumerate(range(0, len(view), part_size))]

        def upload(part: tuple[int, int]) -> dict[str, Any]:
            number, start = part
            body = view[start : start + part_size].tobytes()
            response = self._retry(
                f"upload part {number} of {key}",
                lambda: self._request(
                    "UploadPart",
                    len(body),
                    lambda: self.client.upload_part(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body,
                    ),
                ),
            )
            done: dict[str, Any] = {"PartNumber": number, "ETag": response["ETag"]}
            # Echo any checksum botocore added, or a checksummed upload cannot complete.
            for name in ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumSHA1", "ChecksumSHA256"):
                if response.get(name):
                    done[name] = response[name]
            return done

        completed = False
        try:
            workers = min(self.upload_concurrency, len(bounds))
            with ThreadPoolExecutor(workers, thread_name_prefix="s3-part") as pool:
                parts = builtins.list(pool.map(upload, bounds))
            etag = self._conditional_write(
                f"complete multipart upload {key}",
                key,
                token,
                if_match,
                bool(conditions),
                lambda: self._request(
                    "CompleteMultipartUpload",
                    0,
                    lambda: self.client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": parts},
                        **conditions,
                    ),
                ),
                multipart=True,
            )
            completed = True
            return etag
        except ClientError as exc:
            raise self._error(f"multipart upload {key}", exc) from exc
        finally:
            if not completed:
                self._abort(full, upload_id)

    def _abort(self, full_key: str, upload_id: str) -> None:
        # Best effort: the parts of an upload left behind cost storage, so a bucket lifecycle
        # rule (AbortIncompleteMultipartUpload) should back this up.
        try:
            self._request(
                "AbortMultipartUpload",
                0,
                lambda: self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=full_key, UploadId=upload_id
                ),
            )
        except (ClientError, BotoCoreError):
            pass

    def delete_many(self, keys: Iterable[str]) -> None:
        batch: builtins.list[str] = []
        for key in keys:
            batch.append(self._full(key))
            if len(batch) == self.delete_batch_size:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, full_keys: builtins.list[str]) -> None:
        request = {"Objects": [{"Key": k} for k in full_keys], "Quiet": True}
        try:
            response = self._retry(
                f"delete {len(full_keys)} objects",
                lambda: self._request(
                    "DeleteObjects",
                    0,
                    lambda: self.client.delete_objects(Bucket=self.bucket, Delete=request),
                ),
            )
        except ClientError as exc:
            raise self._error(f"delete {len(full_keys)} objects", exc) from exc
        errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            shown = ", ".join(f"{e.get('Key')}: {e.get('Code')}" for e in errors[:5])
            raise ObjectStoreError(
                f"s3://{self.bucket}: {len(errors)} of {len(full_keys)} deletes failed ({shown})"
            )
