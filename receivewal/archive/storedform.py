"""The stored form: what a file is at rest, with its one writer and its one reader.

A file at rest is its bytes compressed (one method of the table,
:data:`~receivewal.archive.compression.FORMATS`, or none), then sealed (an age file to a
recipient set, :mod:`~receivewal.archive.agestream`): two filters stacked over the bytes, in
that order, whatever the file is. :class:`StoredForm` says which (and the name's suffixes:
``.zst`` then ``.age``); :meth:`StoredForm.writer` pushes a file's bytes through its layers
(:class:`FormWriter`); :func:`plain_chunks` reads a stored file back to its plaintext, and
:func:`unsealed_reader` and :func:`unsealed_bytes` take the sealing layer off alone.

Every writer of files at rest goes through it: the segment writer (a ``.partial`` is its
form's compression alone, sealed once complete), a ``.partial`` converted to another method,
a backup's tars and manifest, the change log's files; and every reader that decrypts: a
sealed backup's files, the change files ``analyze --changes`` reads, a sealed segment
(:class:`~receivewal.archive.sealed.Unsealer`). No other module builds a compressor, a
decoder or an encryptor, nor imports a codec library or pyrage (tests/test_storedform.py).
Where a sealed file's recipients are kept, and the check of a sealed file without a key, are
:mod:`~receivewal.archive.sealed`'s; the keys are :mod:`~receivewal.archive.encryption`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, BinaryIO

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec, decompress_chunks
from receivewal.archive.recipients import RecipientSet
from receivewal.wal.names import ENCRYPTED_SUFFIX, AtRest

if TYPE_CHECKING:
    from receivewal.archive.agestream import Encryptor
    from receivewal.archive.codecs import Compressor
    from receivewal.archive.encryption import Keys


@dataclass(frozen=True)
class StoredForm:
    """How a file is kept at rest: compressed as ``compress`` says, then sealed to
    ``recipients`` (None: plain)."""

    compress: CompressSpec = NO_COMPRESSION
    recipients: RecipientSet | None = None

    @property
    def method(self) -> str:
        """The compression method ("" for none)."""
        return self.compress.method

    @property
    def sealed(self) -> bool:
        """Whether the file is sealed (``--encrypt-to``)."""
        return self.recipients is not None

    @property
    def suffix(self) -> str:
        """What the stored file's name adds to its own: the compression's suffix, then
        ``.age`` when sealed."""
        return AtRest(self.method).suffix + (ENCRYPTED_SUFFIX if self.sealed else "")

    def name(self, name: str) -> str:
        """The stored name of the file ``name``."""
        return name + self.suffix

    def compression(self) -> StoredForm:
        """This form's compression alone (a ``.partial``: never sealed)."""
        return replace(self, recipients=None)

    def sealing(self) -> StoredForm:
        """This form's sealing alone (a file already compressed, or kept plain)."""
        return replace(self, compress=NO_COMPRESSION)

    def writer(self) -> FormWriter:
        """A writer of one file in this form."""
        return FormWriter(self)

    def stored_bytes(self, data: bytes) -> bytes:
        """The stored bytes of a small file whole in memory (a backup's manifest)."""
        if not self.method and self.recipients is not None:
            from receivewal.archive.agestream import encrypt_bytes  # noqa: PLC0415 - pyrage

            return encrypt_bytes(data, self.recipients)
        with self.writer() as writer:
            return b"".join((bytes(writer.begin()), bytes(writer.update(data)),
                             writer.finish()))


PLAIN = StoredForm()


class FormWriter:
    """One file's bytes through its form's layers, pushed: ``begin`` returns its first bytes,
    ``update`` the stored bytes of the next data that are ready, ``flush`` what makes the data
    so far readable (a compressed ``.partial``'s sync flush: a sealed file is readable only
    once finished), ``finish`` the rest; the caller writes them, in order. Memory: the
    compressor's window and the encryptor's (:data:`~receivewal.archive.agestream.WINDOW`).
    ``close`` (or leaving the ``with`` block) gives an unfinished file up."""

    def __init__(self, form: StoredForm) -> None:
        self.form = form
        self._compressor: Compressor | None = None
        self._encryptor: Encryptor | None = None
        if form.method:
            from receivewal.archive.compression import new_compressor  # noqa: PLC0415

            self._compressor = new_compressor(form.compress)
        if form.recipients is not None:
            from receivewal.archive.agestream import Encryptor  # noqa: PLC0415 - pyrage

            self._encryptor = Encryptor(form.recipients)

    def __enter__(self) -> FormWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _sealed(self, data: bytes | memoryview) -> bytes | memoryview:
        return data if self._encryptor is None or not data else self._encryptor.update(data)

    def begin(self) -> bytes | memoryview:
        """The file's first bytes (a compressor's header), possibly none."""
        return self._sealed(self._compressor.begin()) if self._compressor is not None else b""

    def update(self, data: bytes | memoryview) -> bytes | memoryview:
        """The stored bytes of the file's next ``data`` that are ready."""
        return self._sealed(data if self._compressor is None
                            else self._compressor.compress(data))

    def flush(self) -> bytes | memoryview:
        """The compressor's pending output, so that the data so far decodes (unsealed)."""
        return self._sealed(self._compressor.flush()) if self._compressor is not None else b""

    def finish(self) -> bytes:
        """The rest of the file."""
        tail = bytes(self._compressor.finish()) if self._compressor is not None else b""
        if self._encryptor is None:
            return tail
        return bytes(self._sealed(tail)) + self._encryptor.finish()

    def close(self) -> None:
        """Give an unfinished file up (the encryptor's thread stopped)."""
        if self._encryptor is not None:
            self._encryptor.close()


# -- reading -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unsealing:
    """What opens a sealed file: the identity file's ``keys``, the ``file``'s name for
    messages, and its ``recipients`` when known (making a refusal precise)."""

    keys: Keys
    file: str
    recipients: RecipientSet | None = None


def unsealed_reader(source: BinaryIO, unsealing: Unsealing) -> BinaryIO:
    """A reader of the plaintext of the sealed file ``source`` reads (its last read raises
    DecryptionFailed or NotARecipient naming the file when it is not whole)."""
    from receivewal.archive.agestream import decrypting_reader  # noqa: PLC0415 - pyrage

    return decrypting_reader(source, unsealing.keys, file=unsealing.file,
                             recipients=unsealing.recipients)


def unsealed_bytes(raw: bytes | memoryview, unsealing: Unsealing) -> bytes:
    """The plaintext of the sealed file whose bytes are ``raw`` (whole in memory)."""
    from receivewal.archive.agestream import decrypt_bytes  # noqa: PLC0415 - pyrage

    return decrypt_bytes(raw, unsealing.keys, file=unsealing.file,
                         recipients=unsealing.recipients)


def plain_chunks(source: BinaryIO, method: str, unsealing: Unsealing | None = None, *,
                 cap: int | None = None, truncated_ok: bool = False) -> Iterator[bytes]:
    """The plaintext of a stored file read from ``source``, chunk by chunk: unsealed first
    when ``unsealing`` is given, then decompressed as ``method`` says (see
    :func:`~receivewal.archive.compression.decompress_chunks` for ``cap`` and
    ``truncated_ok``)."""
    if unsealing is None:
        yield from decompress_chunks(source, method, cap=cap, truncated_ok=truncated_ok)
        return
    with unsealed_reader(source, unsealing) as plain:
        yield from decompress_chunks(plain, method, cap=cap, truncated_ok=truncated_ok)
