"""An archive in object storage: the only module that imports boto3 and botocore.

boto3 is imported when a :class:`Bucket` connects, never at import time, so that nothing that
merely names object storage pays for it (or needs the ``s3`` extra). Endpoint, region and
credentials come from boto3's standard chain (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance and web-identity roles); receivewal adds
no option of its own for them.

Every library error becomes one of the project's (:mod:`receivewal.errors`): ``ObjectNotFound``
only for a definite "no such key", ``StoreAccessDenied`` for rejected credentials or
permissions, ``StoreRefused`` for a request that cannot succeed, ``StoreError`` (retryable) for
the rest. Retryable errors are retried by :func:`~receivewal.archive.objectstore.with_retries`
(exponential backoff, full jitter); botocore's own retries stay few and short inside each try.

Every request is bounded (:class:`~receivewal.archive.objectstore.Patience`): a command's
client waits ``RECEIVEWAL_STORE_TIMEOUT`` seconds (15) for each answer and tries a call 3 times
(:func:`~receivewal.archive.objectstore.command_patience`), and says on standard error, after
at most 10 s, what it waits for. After a stop signal
(:func:`~receivewal.archive.objectstore.stop_store_calls`) the requests are hurried (a second
client with short timeouts), tried once, and none begins after a few seconds.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar, cast

from receivewal.archive.location import Location
from receivewal.archive.objectbody import CHUNK, HashingSink, opened_body, sha256_of
from receivewal.archive.objectstore import (
    COMMAND_RETRY,
    HURRIED,
    STORE_TIMEOUT_ENV,
    BucketUrl,
    ObjectStream,
    Patience,
    RetryPolicy,
    StoreWatch,
    bounded_call,
    command_patience,
    parse_bucket_url,
    say_on_stderr,
    store_stopping,
)
from receivewal.archive.reading import capped
from receivewal.errors import (
    ArchiveError,
    ConfigurationError,
    ObjectConflict,
    ObjectNotFound,
    ReceivewalError,
    StoreAccessDenied,
    StoreError,
    StoreRefused,
)

_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled",
                 "RequestTimeTooSkewed", "InvalidSecurity"}
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException",
                    "InternalError", "ServiceUnavailable", "BadDigest",
                    "XAmzContentSHA256Mismatch", "ConditionalRequestConflict"}
_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError",
                      "CredentialRetrievalError", "TokenRetrievalError", "SSOError"}
_CONFIG_ERRORS = {"ProfileNotFound", "ConfigParseError", "NoRegionError",
                  "InvalidS3AddressingStyleError", "UnknownEndpointError"}
T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What HEAD says of an object."""

    size: int
    sha256: str | None  # hex; None when the store keeps no SHA-256 checksum for it


def client_config(patience: Patience | None = None) -> Any:
    """botocore's Config: path-style addressing (S3-compatible stores, dotted bucket names),
    checksums only where an operation requires them (boto3 >= 1.36 otherwise adds CRC checksums
    by default, which several S3-compatible stores reject), bounded timeouts, few retries."""
    from botocore.config import Config  # noqa: PLC0415 - boto3 only where the store is used

    patience = patience or Patience()
    return Config(
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=patience.connect,
        read_timeout=patience.read,
        tcp_keepalive=True,
        retries={"mode": "standard", "total_max_attempts": patience.attempts},
    )


def _hex_of(checksum: object) -> str | None:
    """A SHA-256 header value (base64) as hex; None for a composite (multipart) or none."""
    if not isinstance(checksum, str) or "-" in checksum:
        return None
    try:
        raw = base64.b64decode(checksum, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


class Bucket(Location):
    """An archive at a bucket's prefix: create-only uploads, reads by exact key (the S3
    driver of :class:`~receivewal.archive.location.Location`)."""

    def __init__(self, url: BucketUrl, client: Any, retry: RetryPolicy, *,
                 patience: Patience | None = None, hurried: Callable[[], Any] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        from botocore import exceptions  # noqa: PLC0415 - boto3 only where the store is used

        self.url = url
        self._client = client
        self.retry = retry
        self.patience = patience or Patience()
        self.endpoint = str(client.meta.endpoint_url)
        self._hurried = hurried  # makes the client used after a stop signal
        self._hurried_client: Any = None
        self._say = say or say_on_stderr
        self._watch = None if self.patience.notice is None else \
            StoreWatch(self.patience.notice, self._waited)
        self._exceptions = exceptions
        self.library_errors = (exceptions.ClientError, exceptions.BotoCoreError)

    @property
    def client(self) -> Any:
        """boto3's S3 client; after a stop signal, one that waits :data:`HURRIED` at most."""
        if self._hurried is not None and store_stopping():
            if self._hurried_client is None:
                self._hurried_client = self._hurried()
            return self._hurried_client
        return self._client

    @classmethod
    def connect(cls, url: str | BucketUrl, retry: RetryPolicy | None = None,
                patience: Patience | None = None) -> Bucket:
        """A client from boto3's standard chain (no request is sent yet), as patient with the
        store as ``patience`` says (default: a command's,
        :func:`~receivewal.archive.objectstore.command_patience`, with :data:`COMMAND_RETRY`)."""
        parsed = url if isinstance(url, BucketUrl) else parse_bucket_url(url)
        try:
            import boto3  # noqa: PLC0415 - only here: the s3 extra is optional
            from botocore.exceptions import BotoCoreError  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigurationError(f"{parsed}: object storage needs boto3, which is not "
                                     "installed: pip install 'receivewal[s3]'") from exc
        patience = patience or command_patience(os.environ)
        session = boto3.session.Session()
        try:
            client = session.client("s3", config=client_config(patience))
        except (BotoCoreError, ValueError) as exc:
            raise ConfigurationError(f"{parsed}: cannot configure the S3 client: {exc}") from exc
        return cls(parsed, client, retry or COMMAND_RETRY, patience=patience,
                   hurried=lambda: session.client("s3", config=client_config(HURRIED)))

    def key(self, name: str) -> str:
        """The object key of the file ``name`` (``PREFIX/name``)."""
        return self.url.key(name)

    # -- the location's interface ------------------------------------------------------------
    def where(self, name: str = "") -> str:
        return self.url.url(name) if name else str(self.url)

    def listing(self, folder: str = "") -> list[tuple[str, int]]:
        return self.list_under(folder) if folder else self.list_files()

    def open(self, name: str) -> BinaryIO:
        return cast(BinaryIO, self.open_object(name))

    def read_small(self, name: str, cap: int) -> bytes:
        with self.open(name) as stream:
            return capped(stream, cap, self.where(name))

    def exists(self, name: str) -> bool:
        try:
            self.head(name)
        except ObjectNotFound:
            return False
        return True

    # -- requests ----------------------------------------------------------------------------
    def put_new(self, name: str, source: Path | bytes) -> bool:
        """Upload a file (streamed from disk) or bytes to ``PREFIX/name``, never overwriting;
        True when this call stored it, False when these very bytes were there already.

        Create-only (``If-None-Match: *``) with its SHA-256. When the key exists, the stored
        object's checksum decides: the same is success (a retry after a lost reply), another is
        :class:`ObjectConflict`, and the stored object is left as it was.
        """
        digest, size = sha256_of(source)
        return self.retried(lambda: self._put_once(name, source, digest, size), name)

    def _put_once(self, name: str, source: Path | bytes, digest: str, size: int) -> bool:
        checksum = base64.b64encode(bytes.fromhex(digest)).decode()
        try:
            with opened_body(source) as body:
                self.client.put_object(Bucket=self.url.bucket, Key=self.key(name), Body=body,
                                       IfNoneMatch="*", ChecksumSHA256=checksum)
        except self.library_errors as exc:
            if not self.precondition_failed(exc):
                raise self.translated(exc, name) from exc
            self.check_same(name, digest, size)
            return False
        return True

    def precondition_failed(self, exc: Exception) -> bool:
        if not isinstance(exc, self._exceptions.ClientError):
            return False
        error, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
        return bool(error.get("Code") == "PreconditionFailed" or meta.get("HTTPStatusCode") == 412)

    def check_same(self, name: str, digest: str, size: int) -> None:
        """The key exists: success when it holds these very bytes, else ObjectConflict."""
        info = self._head_once(name)
        theirs = info.sha256
        if theirs is None and info.size == size:  # a store that keeps no SHA-256: read it
            hasher = HashingSink()
            self._get_once(name, hasher, size)
            theirs = hasher.digest.hexdigest()
        if info.size == size and theirs == digest:
            return
        raise ObjectConflict(
            f"{self.url.url(name)}: a different object is already stored at this key "
            f"({info.size} bytes, SHA-256 {theirs or 'unknown'}; this upload: {size} bytes, "
            f"SHA-256 {digest}); it is left as it is and nothing is overwritten")

    def head(self, name: str) -> ObjectInfo:
        """Size and SHA-256 of ``PREFIX/name``; ObjectNotFound when it does not exist."""
        return self.retried(lambda: self._head_once(name), name)

    def _head_once(self, name: str) -> ObjectInfo:
        try:
            response = self.client.head_object(Bucket=self.url.bucket, Key=self.key(name),
                                               ChecksumMode="ENABLED")
        except self.library_errors as exc:
            raise self.translated(exc, name) from exc
        return ObjectInfo(int(response.get("ContentLength", 0)),
                          _hex_of(response.get("ChecksumSHA256")))

    def get(self, name: str, dest: IO[bytes], max_size: int) -> int:
        """Stream ``PREFIX/name`` into ``dest`` (from its current position, which a retry
        rewinds to and truncates at); the number of bytes. An object over ``max_size`` bytes is
        an ArchiveError; a missing key is ObjectNotFound."""
        start = dest.tell()

        def attempt() -> int:
            dest.seek(start)
            dest.truncate()
            return self._get_once(name, dest, max_size)

        return self.retried(attempt, name)

    def get_bytes(self, name: str, max_size: int) -> bytes:
        """``PREFIX/name`` in memory, at most ``max_size`` bytes (see :meth:`get`)."""
        out = io.BytesIO()
        self.get(name, out, max_size)
        return out.getvalue()

    def _get_once(self, name: str, dest: IO[bytes] | HashingSink, max_size: int) -> int:
        try:
            response = self.client.get_object(Bucket=self.url.bucket, Key=self.key(name),
                                              ChecksumMode="ENABLED")
            body = response["Body"]
            try:
                self._check_size(name, int(response.get("ContentLength", 0)), max_size)
                count = 0
                for chunk in body.iter_chunks(CHUNK):
                    count += len(chunk)
                    self._check_size(name, count, max_size)
                    dest.write(chunk)
            finally:
                body.close()
        except self.library_errors as exc:
            raise self.translated(exc, name) from exc
        return count

    def _check_size(self, name: str, size: int, max_size: int) -> None:
        if size > max_size:
            raise ArchiveError(f"{self.url.url(name)}: the object is larger than {max_size} "
                               f"bytes ({size}), more than this archive's files can be")

    def list_names(self, page_size: int = 1000) -> list[str]:
        """The file names directly under the prefix, sorted (every page: for verify and
        analyze only; uploads and restores go by exact key, as listings lag on some stores)."""
        return [name for name, _ in self.list_files(page_size)]

    def list_files(self, page_size: int = 1000) -> list[tuple[str, int]]:
        """(file name, size) of every object directly under the prefix, sorted by name."""
        return self.retried(lambda: self._list_once(page_size), "")

    def _list_once(self, page_size: int) -> list[tuple[str, int]]:
        start = f"{self.url.prefix}/" if self.url.prefix else ""
        files: list[tuple[str, int]] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=start, Delimiter="/",
                PaginationConfig={"PageSize": page_size})
            for page in pages:
                files.extend((item["Key"][len(start):], int(item.get("Size", 0)))
                             for item in page.get("Contents", ()))
        except self.library_errors as exc:
            raise self.translated(exc, "") from exc
        return sorted(files)

    def names_after(self, start: str, after: str, count: int) -> list[str]:
        """The first ``count`` file names directly under the prefix that begin with ``start``
        and sort after ``after``, in order: ONE request (ListObjectsV2 with Prefix and
        StartAfter), for a restore call that misses a segment (is WAL of its timeline held
        after it?)."""
        return self.retried(lambda: self._names_after_once(start, after, count), after)

    def _names_after_once(self, start: str, after: str, count: int) -> list[str]:
        base = f"{self.url.prefix}/" if self.url.prefix else ""
        try:
            page = self.client.list_objects_v2(Bucket=self.url.bucket, Prefix=base + start,
                                               StartAfter=base + after, MaxKeys=count)
        except self.library_errors as exc:
            raise self.translated(exc, after) from exc
        return [item["Key"][len(base):] for item in page.get("Contents", ())
                if "/" not in item["Key"][len(base):]]

    def list_under(self, folder: str, page_size: int = 1000) -> list[tuple[str, int]]:
        """(name, size) of every object under ``PREFIX/folder/``, at any depth, named from the
        prefix (``folder/...``), sorted: the backups of ``cleanup`` and ``status``."""
        return self.retried(lambda: self._list_under_once(folder, page_size), folder)

    def _list_under_once(self, folder: str, page_size: int) -> list[tuple[str, int]]:
        base = f"{self.url.prefix}/" if self.url.prefix else ""
        files: list[tuple[str, int]] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=f"{base}{folder}/",
                PaginationConfig={"PageSize": page_size})
            for page in pages:
                files.extend((item["Key"][len(base):], int(item.get("Size", 0)))
                             for item in page.get("Contents", ()))
        except self.library_errors as exc:
            raise self.translated(exc, folder) from exc
        return sorted(files)

    def delete(self, name: str) -> None:
        """Remove ``PREFIX/name`` (gone already: done). The one deletion of the store, for
        ``cleanup`` and a backup given up (its own objects): every other writer only
        creates."""
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise ArchiveError(f"{name!r} is not a file name of the archive")

        def attempt() -> None:
            try:
                self.client.delete_object(Bucket=self.url.bucket, Key=self.key(name))
            except self.library_errors as exc:
                error = self.translated(exc, name)
                if not isinstance(error, ObjectNotFound):
                    raise error from exc

        self.retried(attempt, name)

    def unfinished_uploads(self, folder: str) -> list[tuple[str, str]]:
        """(name from the prefix, upload ID) of every multipart upload begun and neither
        completed nor aborted under ``PREFIX/folder/``: what a killed backup left."""
        base = f"{self.url.prefix}/" if self.url.prefix else ""

        def attempt() -> list[tuple[str, str]]:
            found: list[tuple[str, str]] = []
            try:
                pages = self.client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=self.url.bucket, Prefix=f"{base}{folder}/")
                for page in pages:
                    found.extend((item["Key"][len(base):], str(item["UploadId"]))
                                 for item in page.get("Uploads", ()))
            except self.library_errors as exc:
                raise self.translated(exc, folder) from exc
            return sorted(found)

        return self.retried(attempt, folder)

    def abort_upload(self, name: str, upload_id: str) -> None:
        """Abort the multipart upload ``upload_id`` of ``PREFIX/name`` (its parts are
        dropped; gone already: done). For ``cleanup``, of a backup it removes."""
        def attempt() -> None:
            try:
                self.client.abort_multipart_upload(Bucket=self.url.bucket, Key=self.key(name),
                                                   UploadId=upload_id)
            except self.library_errors as exc:
                error = self.translated(exc, name)
                if not isinstance(error, ObjectNotFound):
                    raise error from exc

        self.retried(attempt, name)

    def open_object(self, name: str) -> IO[bytes]:
        """``PREFIX/name`` as a buffered stream read from the network as it is consumed
        (bounded memory whatever the object's size). The request is retried; an error while
        reading is the project's error, not retried (the reader reports the file)."""
        body = self.retried(lambda: self._open_once(name), name)
        return io.BufferedReader(ObjectStream(body, lambda exc: self.translated(exc, name),
                                               self.library_errors), CHUNK)

    def _open_once(self, name: str) -> Any:
        try:
            return self.client.get_object(Bucket=self.url.bucket, Key=self.key(name))["Body"]
        except self.library_errors as exc:
            raise self.translated(exc, name) from exc

    # -- errors ------------------------------------------------------------------------------
    def retried(self, action: Callable[[], T], name: str) -> T:
        """``action`` (requests about ``PREFIX/name``; "": the prefix) with the retry policy;
        when the patience says so, a line after ``notice`` seconds says what is waited for."""
        return bounded_call(action, self.retry, self.waiting_for(name), self._watch)

    def waiting_for(self, name: str) -> str:
        """What a call about ``PREFIX/name`` waits for, in words."""
        return (f"the object store at {self.endpoint} "
                f"({self.url.url(name) if name else self.url})")

    def _waited(self, what: str, seconds: float) -> None:
        self._say(f"waiting for {what}: no answer for {seconds:g} s (each request waits "
                  f"{self.patience.read:g} s at most, {STORE_TIMEOUT_ENV}; a call is tried "
                  f"{self.retry.attempts} times)")

    def translated(self, exc: Exception, name: str) -> ReceivewalError:
        """The project's error for a boto3/botocore error about ``PREFIX/name``."""
        where = f"{self.url.url(name) if name else self.url} at {self.endpoint}"
        if isinstance(exc, self._exceptions.ClientError):
            return _client_error(exc.response, where)
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if kinds & _CREDENTIAL_ERRORS:
            return StoreAccessDenied(f"{where}: no usable credentials ({exc}); configure them "
                                     "as for the AWS CLI (AWS_ACCESS_KEY_ID and "
                                     "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role)")
        if kinds & _CONFIG_ERRORS:
            return ConfigurationError(f"{where}: {exc}")
        if kinds & {"ReadTimeoutError", "ConnectTimeoutError"}:
            read = HURRIED.read if self._hurried is not None and store_stopping() \
                else self.patience.read
            return StoreError(f"{where}: no answer from the store within {read:g} s "
                              f"({type(exc).__name__}: {exc})")
        return StoreError(f"{where}: {type(exc).__name__}: {exc}")


def _client_error(response: dict[str, Any], where: str) -> ReceivewalError:
    error, meta = response.get("Error", {}), response.get("ResponseMetadata", {})
    code, status = str(error.get("Code", "")), int(meta.get("HTTPStatusCode") or 0)
    detail = f"{code or status}: {str(error.get('Message') or '')[:200]}".rstrip(": ")
    if code == "NoSuchBucket":
        return StoreRefused(f"{where}: no such bucket ({detail})")
    if status == 404 or code in {"NoSuchKey", "NotFound"}:
        return ObjectNotFound(f"{where}: no such key ({detail})")
    if status in {401, 403} or code in _ACCESS_CODES:
        return StoreAccessDenied(f"{where}: access denied ({detail}); check the credentials "
                                 "and the bucket policy")
    if status >= 500 or status in {408, 409, 429} or code in _TRANSIENT_CODES:
        return StoreError(f"{where}: the store failed the request ({detail})")
    return StoreRefused(f"{where}: the store refused the request ({detail})")
