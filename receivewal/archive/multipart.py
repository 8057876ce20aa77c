"""An object written piece by piece: an S3 multipart upload, completed create-only.

A base backup's tars are uploaded as they arrive from the server, too large to hold and of a
size not known in advance: :class:`StreamUpload` sends each part as it fills (memory: one
part) through the bucket's requests (:class:`~receivewal.archive.bucket.Bucket`: retries,
errors, the store's patience), and completes the object only when it is whole, create-only.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from receivewal.archive.bucket import Bucket
from receivewal.archive.objectstore import waiting_for_store
from receivewal.errors import StopRequested


class StreamUpload:
    """An object written piece by piece: a multipart upload whose parts are sent as they fill
    (memory: one part), completed create-only (``If-None-Match: *``), so that an object
    already at the key stays as it was (:class:`ObjectConflict`, unless it holds these very
    bytes: a retry after a lost reply). Each request is retried by the bucket's policy;
    :meth:`abort` gives the upload up (the store drops its parts)."""

    PART = 16 << 20  # bytes; parts grow by as much every 2,000 (S3 allows 10,000)

    def __init__(self, bucket: Bucket, name: str) -> None:
        self.bucket, self.name = bucket, name
        self.size = 0
        self.digest = hashlib.sha256()
        self._buffer = bytearray()
        self._parts: list[dict[str, Any]] = []
        self._upload_id: str | None = bucket.retried(self._create_once, name)

    def _create_once(self) -> str:
        try:
            response = self.bucket.client.create_multipart_upload(
                Bucket=self.bucket.url.bucket, Key=self.bucket.key(self.name))
        except self.bucket.library_errors as exc:
            raise self.bucket.translated(exc, self.name) from exc
        return str(response["UploadId"])

    def _part_size(self) -> int:
        return self.PART * (1 + len(self._parts) // 2000)

    def write(self, data: bytes | memoryview) -> None:
        """The object's next bytes; a part is sent each time enough have gathered."""
        self._buffer += data
        self.size += len(data)
        self.digest.update(data)
        while len(self._buffer) >= self._part_size():
            size = self._part_size()
            self._send(bytes(self._buffer[:size]))
            del self._buffer[:size]

    def _send(self, body: bytes) -> None:
        number = len(self._parts) + 1

        def attempt() -> str:
            try:
                response = self.bucket.client.upload_part(
                    Bucket=self.bucket.url.bucket, Key=self.bucket.key(self.name),
                    UploadId=self._upload_id, PartNumber=number, Body=body)
            except self.bucket.library_errors as exc:
                raise self.bucket.translated(exc, self.name) from exc
            return str(response["ETag"])

        self._parts.append({"ETag": self.bucket.retried(attempt, self.name),
                            "PartNumber": number})

    def finish(self) -> int:
        """Send the last part and complete the upload, create-only; the object's size."""
        if self._buffer or not self._parts:
            self._send(bytes(self._buffer))
            self._buffer = bytearray()
        self.bucket.retried(self._complete_once, self.name)
        self._upload_id = None
        return self.size

    def _complete_once(self) -> None:
        try:
            self.bucket.client.complete_multipart_upload(
                Bucket=self.bucket.url.bucket, Key=self.bucket.key(self.name),
                UploadId=self._upload_id, IfNoneMatch="*",
                MultipartUpload={"Parts": self._parts})
        except self.bucket.library_errors as exc:
            if not self.bucket.precondition_failed(exc):
                raise self.bucket.translated(exc, self.name) from exc
            self.abort()
            self.bucket.check_same(self.name, self.digest.hexdigest(), self.size)

    def abort(self) -> None:
        """Give the upload up (best effort: a store keeps what it could not be told to drop
        until its own lifecycle rule does)."""
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        with contextlib.suppress(*self.bucket.library_errors, StopRequested), \
                waiting_for_store(self.bucket.waiting_for(self.name)):
            self.bucket.client.abort_multipart_upload(
                Bucket=self.bucket.url.bucket, Key=self.bucket.key(self.name),
                UploadId=upload_id)
