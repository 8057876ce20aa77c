"""Restoring one file from an archive in object storage (``receivewal restore -D s3://...``).

The same at-rest forms as a local archive, in the same order (plain, then compressed), each
fetched by its exact key: no listing, which lags on some stores and needs s3:ListBucket. Each
object is read into a bounded buffer (in memory up to 64 MiB, beyond that an unnamed file next
to ``%p``), then decoded, checked against the prefix's identity object (read once per
source) and written to ``%p`` exactly as a local file is
(:func:`receivewal.restore.local.write_restored`).

A source that restores many segments (the prefetch filler's, one per recovery) asks first for
the form that served the last segment: an archive keeps one form, and every form asked for
before it costs a round trip answered "no such key".

Only when the prefix holds the archive's identity object and the store says "no such key" for
every form is the file :class:`NotInArchive` (exit 1 ends recovery there, unless the prefix
holds later WAL of the segment's timeline: a hole, exit 126, :meth:`BucketSource.later_wal`,
one listing on a miss only): a prefix without
one (a mistyped prefix, another endpoint) is an error, whatever the file. Network, throttling
and access errors are retried with backoff a few times (:data:`RESTORE_RETRY`) and then
raised: the command exits 126 and PostgreSQL retries later, rather than end recovery early. On
AWS, a GET of a missing key without s3:ListBucket on the bucket is answered 403, not 404: it
reads as access denied, never as absent.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

from receivewal.archive.bucket import Bucket
from receivewal.archive.durable import spooled_buffer
from receivewal.archive.identity import (
    IDENTITY_FILE,
    ArchiveIdentity,
    read_identity,
    sealed_fingerprints,
)
from receivewal.archive.objectstore import Patience, RetryPolicy
from receivewal.archive.recipients import RECIPIENTS_FILE_CAP
from receivewal.archive.sources import decide_segment_size
from receivewal.errors import ArchiveError, ConfigurationError, ObjectNotFound
from receivewal.restore.writing import Candidate, NotInArchive, write_restored
from receivewal.wal.leannames import next_held_after, sealed_suffix, split_sealed
from receivewal.wal.lsn import MAX_SEGMENT_SIZE
from receivewal.wal.names import (
    AtRest,
    is_other_wal_file_name,
    is_wal_file_name,
)

#: A restore_command call retries a failing store for a few seconds at most, then exits 126.
RESTORE_RETRY = RetryPolicy(attempts=4, base_delay=0.25, max_delay=2.0)
#: Seconds each try may take to connect, and to wait for each read (boto3's are 60): a store
#: that accepts connections and never answers costs a call about 4 x 5 s, not 4 x 3 x 60 s
#: (the call's whole time is bounded as well, by RECEIVEWAL_RESTORE_TIMEOUT).
RESTORE_PATIENCE = Patience(connect=3.0, read=5.0, attempts=1)
_IN_MEMORY = 64 << 20
# the largest object any archive file can be: a segment of the largest size, compressed by a
# codec that expands incompressible input a little
_MAX_OBJECT = MAX_SEGMENT_SIZE + MAX_SEGMENT_SIZE // 64
#: How many keys the one listing after a missed segment asks for: the next segment's forms
#: come first (a segment is stored in one form or two, its sealed recipients beside it).
LATER_KEYS = 16


class BucketSource:
    """An archive at ``s3://BUCKET/PREFIX`` to restore files from (one client, reused)."""

    def __init__(self, url: str, retry: RetryPolicy = RESTORE_RETRY, *,
                 identity_file: str | None = None) -> None:
        self.bucket = Bucket.connect(url, retry, RESTORE_PATIENCE)
        self.last_form: tuple[AtRest, bool, str] | None = None  # the form that served the
        # last segment: its at-rest format, whether sealed, and to which set
        self.identity_file = identity_file  # --identity: decrypts sealed objects
        self._identity: ArchiveIdentity | None = None  # read once, then kept

    def identity(self) -> ArchiveIdentity:
        """The prefix's identity object, read on first use and kept for this source's life
        (the filler's: one recovery). A prefix without one is no archive receivewal wrote (a
        mistyped prefix, another endpoint or profile): an ArchiveError, never "not in the
        archive", which would end recovery early."""
        if self._identity is None:
            identity = read_identity(self.bucket)
            if identity is None:
                raise ArchiveError(
                    f'"{self.bucket.url.url(IDENTITY_FILE)}": no archive identity object at '
                    f"{self.bucket.url} (at {self.bucket.endpoint}): not an archive receivewal "
                    "wrote there (a mistyped prefix, or another endpoint or profile?); "
                    "nothing is restored from it")
            self._identity = identity
        return self._identity

    def segment_size(self) -> int:
        """The archive's segment size by the one rule,
        :func:`~receivewal.archive.sources.decide_segment_size` (verify's, a directory's and
        the filler's too): the identity object's, which a prefix restored from must have (its
        files are then never listed)."""
        size = decide_segment_size(self.identity(), str(self.bucket.url), ())
        assert size is not None  # the identity decides
        return size

    def forms(self, name: str) -> list[Candidate]:
        """The objects that can serve ``name``, in the order they are asked for: plain, then
        compressed, then sealed (to the identity object's sets, newest first, then in the
        older form), but the form that served the last segment first."""
        forms = _forms(name, sealed_fingerprints(self.identity()))
        found = [c for c in forms
                 if c.segment and (c.fmt, c.encrypted, c.fingerprint) == self.last_form]
        return found + [c for c in forms if c not in found]

    def restore(self, name: str, target: Path) -> str:
        """Restore ``name`` to ``target``; the URL of the object it came from.

        Raises NotInArchive when the store has no form of it, the store's errors after the
        retries, ConfigurationError for a bad name, ArchiveError naming a damaged object.
        """
        identity, size = self.identity(), self.segment_size()
        forms = self.forms(name)
        for candidate in [*forms, *self._unlisted_forms(name, forms)]:
            key = candidate.path.name
            with spooled_buffer(target.parent, _IN_MEMORY) as buf:
                try:
                    self.bucket.get(key, buf, _MAX_OBJECT)
                except ObjectNotFound:
                    continue
                url = self.bucket.url.url(key)
                buf.seek(0)
                source: BinaryIO = buf  # type: ignore[assignment]
                if candidate.encrypted:
                    source = self._unsealed(key, url, source, size)
                write_restored(source, candidate, size, target, url, identity=identity)
            if candidate.segment:
                self.last_form = candidate.fmt, candidate.encrypted, candidate.fingerprint
            return url
        raise NotInArchive(f'"{name}" is not in the archive "{self.bucket.url}" (no such key '
                           "in any of its forms)")

    def _unlisted_forms(self, name: str, tried: list[Candidate]) -> list[Candidate]:
        """Sealed forms of segment ``name`` named for a set the identity object does not list
        (it is create-only: a set adopted after the prefix was claimed is listed in the
        archive directory's record alone), asked only once every listed form was "no such
        key": ONE listing of the keys that begin with ``name``."""
        if not is_wal_file_name(name):
            return []
        known = {c.path.name for c in tried}
        found = []
        for key in self.bucket.names_after(name, name, LATER_KEYS):
            sealed = split_sealed(key)
            if key in known or sealed is None or not sealed[1]:
                continue
            fmt = next((f for f in AtRest if sealed[0] == name + f.suffix), None)
            if fmt is not None:
                found.append(Candidate(Path(key), fmt, partial=False, segment=True,
                                       encrypted=True, fingerprint=sealed[1]))
        return found

    def later_wal(self, name: str) -> str | None:
        """The first segment of segment ``name``'s timeline after it that the prefix holds
        (:func:`~receivewal.wal.leannames.next_held_after`), or None: ONE listing of the
        timeline's keys after ``name`` (Prefix: the timeline, StartAfter: ``name``), asked
        only when every form of ``name`` was "no such key"."""
        return next_held_after(name, self.bucket.names_after(name[:8], name, LATER_KEYS))

    def holds(self, name: str) -> bool:
        """Whether any form of ``name`` is there now (a HEAD each): asked only when a miss
        found later WAL, as the archive's writer may have completed it in between."""
        for candidate in self.forms(name):
            try:
                self.bucket.head(candidate.path.name)
            except ObjectNotFound:
                continue
            return True
        return False

    def _unsealed(self, key: str, url: str, raw: BinaryIO, size: int) -> BinaryIO:
        """The plaintext of the sealed object ``key`` fetched into ``raw``; the identity
        object's set its name names, or in the older form its recipients object, says who can
        read it (errors name ``url``)."""
        from receivewal.archive.sealed import Unsealer, known_sets, sealed_cap  # noqa: PLC0415

        base = url[:len(url) - len(key)]

        def open_object(path: str) -> BinaryIO:  # the recipients object
            out = io.BytesIO()
            self.bucket.get(path[len(base):], out, RECIPIENTS_FILE_CAP)
            out.seek(0)
            return out

        sets = known_sets(self.identity().recipient_sets)
        return Unsealer(self.identity_file, sets).opened(url, sealed_cap(size), open_object,
                                                         source=raw)


def _forms(name: str, fingerprints: tuple[str, ...]) -> list[Candidate]:
    if is_other_wal_file_name(name):
        return [Candidate(Path(name), AtRest.PLAIN, partial=False, segment=False)]
    if not is_wal_file_name(name):
        raise ConfigurationError(f"{name!r} is not a WAL segment or history file name")
    plain = [Candidate(Path(name + fmt.suffix), fmt, partial=False, segment=True)
             for fmt in AtRest]
    return plain + [Candidate(Path(name + fmt.suffix + sealed_suffix(fingerprint)), fmt,
                              partial=False, segment=True, encrypted=True,
                              fingerprint=fingerprint)
                    for fingerprint in fingerprints for fmt in AtRest]
