"""Encryption at rest, the files: age files written and read through pyrage, streamed in
bounded memory.

The keys (:class:`~receivewal.archive.encryption.Keys`, recipient sets) and pyrage itself come
from :mod:`receivewal.archive.encryption`; this module moves the bytes. Each way runs in constant
memory whatever the size (age's STREAM: 64 KiB chunks, each authenticated; pyrage reads 8 KiB
at a time):

- :func:`encrypt_stream` and :func:`decrypt_stream`: from a reader to a writer (``read(n)``,
  ``write(b)``: files, pipes, an object's body); from a file to a file (both regular files of
  the operating system, the source at its start, the target empty) pyrage opens the two itself
  and the bytes never pass through Python;
- :class:`Encryptor`: pushed to, like a compressor (``update`` returns what is ready,
  ``finish`` the rest), for a writer fed by a stream it does not pull (a backup's tar arriving
  over COPY); pyrage runs in a worker thread behind a window of :data:`WINDOW` bytes;
- :func:`decrypting_reader`: a reader of the plaintext (e.g. under
  :func:`~receivewal.archive.compression.decompress_chunks` or a tar reader), the same way;
- :func:`encrypt_bytes` and :func:`decrypt_bytes`: whole buffers (a segment: 16 MiB).

What decryption hands over is authentic chunk by chunk, but the file is whole only when the
call (or the reader's last read) ends without an error: a truncated file or a damaged last
chunk fails at its end, after the chunks before it were handed over. So decrypted bytes go
into a temporary file that gets its name only after success (as restore writes ``%p``), or
into memory. A file that does not decrypt is never garbage: it is :class:`DecryptionFailed`
(damaged, truncated, tampered with) or :class:`~receivewal.archive.recipients.NotARecipient`
(the identity holds none of its keys), both naming the file.

The stored form (:mod:`receivewal.archive.storedform`) is what stacks these under compression;
the archive's sealed files and their recipients (:mod:`receivewal.archive.sealed`) use them.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, BinaryIO, Protocol

from receivewal.archive.compression import CorruptFile
from receivewal.archive.encryption import Keys, pyrage, recipient_objects
from receivewal.archive.reading import Readable
from receivewal.archive.recipients import NotARecipient, RecipientSet
from receivewal.errors import ArchiveError

#: The most plaintext an :class:`Encryptor` or a :func:`decrypting_reader` holds between its
#: caller and pyrage's thread.
WINDOW = 4 << 20
_PIECE = 1 << 20
_NOT_FOR_THESE_KEYS = "No matching keys found"  # rage's DecryptError::NoMatchingKeys


class DecryptionFailed(CorruptFile):
    """An encrypted file is damaged, truncated or was tampered with: age's authentication of
    its header or of a chunk failed. Nothing it produced may be used."""


# -- what pyrage reads and writes --------------------------------------------------------------
class _Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


class _Source:
    """The reader pyrage pulls from: remembers the first exception the real reader raised,
    which pyrage wraps in its own error."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self.failure: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return self._read(size)
        except BaseException as exc:
            self.failure = self.failure or exc
            raise


class _Target:
    """The writer pyrage pushes to: remembers the first exception, since pyrage drops an error
    of its last flush; counts the bytes."""

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self.failure: BaseException | None = None
        self.count = 0

    def write(self, data: bytes) -> int:
        if self.failure is not None:
            raise self.failure
        try:
            self._write(data)
        except BaseException as exc:
            self.failure = exc
            raise
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing: the real writer is flushed by its owner."""


def _file_paths(source: object, target: object) -> tuple[str, str] | None:
    """Paths by which pyrage may open ``source`` and ``target`` itself when both are regular
    files of the operating system (``/proc/self/fd/N``), ``source`` at its start and
    ``target`` empty at its start; else None. pyrage then moves the bytes from file to file
    without calling into Python, where through ``encrypt_io`` and ``decrypt_io`` each 8 KiB
    costs two calls (a read and a write) and a copy. It holds the GIL meanwhile, as it does
    between those calls."""
    paths = []
    for end, access in ((source, os.R_OK), (target, os.W_OK)):
        try:
            fd = end.fileno()  # type: ignore[attr-defined]
            at = end.tell()  # type: ignore[attr-defined]
            info = os.fstat(fd)
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation among them
            return None
        path = f"/proc/self/fd/{fd}"
        if not isinstance(fd, int) or at != 0 or not stat.S_ISREG(info.st_mode) \
                or not os.access(path, access):
            return None
        paths.append(path)
    if os.fstat(target.fileno()).st_size != 0:  # type: ignore[attr-defined]
        return None
    return paths[0], paths[1]


def _os_error_of(exc: BaseException) -> OSError | None:
    """The operating system's error that pyrage's file to file call met, rebuilt (pyrage says
    it as ``"... (os error N)"``, an EncryptError's text or an OSError without its errno):
    a full disk is the OSError it is through a Python writer."""
    text = str(exc)
    _head, found, tail = text.rpartition("(os error ")
    number = tail.removesuffix(")")
    if not found or not number.isdigit():
        return None
    return OSError(int(number), os.strerror(int(number)))


def _past_what_pyrage_wrote(target: object) -> int:
    """Move ``target``'s own position to its end (pyrage wrote through another descriptor):
    the bytes it holds."""
    end: int = target.seek(0, os.SEEK_END)  # type: ignore[attr-defined]
    return end


def _carried(source: _Source, target: _Target) -> BaseException | None:
    """The exception a real reader or writer raised during the call, if any."""
    return source.failure or target.failure


def _encryption_error(exc: BaseException) -> ArchiveError:
    return ArchiveError(f"encryption failed: {exc}")


def _decryption_error(exc: BaseException, keys: Keys, file: str,
                      recipients: RecipientSet | None) -> ArchiveError:
    """The project's error for pyrage's refusal to decrypt ``file`` with ``keys``."""
    if _NOT_FOR_THESE_KEYS in str(exc):
        if recipients is None:
            return NotARecipient(file, None, keys.path, keys.public)
        if keys.public.isdisjoint(recipients.recipients):
            return NotARecipient(file, recipients, keys.path, keys.public)
        held = ", ".join(sorted(keys.public & set(recipients.recipients)))
        return DecryptionFailed(f'"{file}": its age header does not open with {held} of the '
                                f'identity file "{keys.path}", which its recipients file '
                                "lists: the header is damaged or was tampered with")
    return DecryptionFailed(f'"{file}" is damaged, truncated or was tampered with: age '
                            f"cannot decrypt it ({exc})")


# -- from a reader to a writer -----------------------------------------------------------------
def encrypt_stream(source: Readable, target: _Writable, recipients: RecipientSet) -> int:
    """Encrypt everything ``source`` reads to ``recipients``, writing the age file to ``target``
    (which its owner flushes and fsyncs); the bytes written. The reader's and writer's own
    exceptions come through as they were raised; ArchiveError when age refuses."""
    module, objects = pyrage(), recipient_objects(recipients)
    paths = _file_paths(source, target)
    if paths is not None:
        try:
            module.encrypt_file(*paths, objects)
        except (module.EncryptError, OSError) as exc:
            raise _os_error_of(exc) or _encryption_error(exc) from None
        return _past_what_pyrage_wrote(target)
    reader, writer = _Source(source.read), _Target(target.write)
    try:
        module.encrypt_io(reader, writer, objects)
    except BaseException as exc:
        carried = _carried(reader, writer)
        if carried is not None:
            raise carried from None
        if isinstance(exc, module.EncryptError | OSError):
            raise _encryption_error(exc) from None
        raise
    if writer.failure is not None:  # the last flush's, which pyrage does not report
        raise writer.failure
    return writer.count


def decrypt_stream(source: Readable, target: _Writable, keys: Keys, *, file: str,
                   recipients: RecipientSet | None = None) -> int:
    """Decrypt the age file ``source`` reads with ``keys``, writing the plaintext to
    ``target``; the bytes written. ``file`` names it in errors, ``recipients`` (its recipients
    file's set, when known) makes them precise. What ``target`` got is whole only when this
    returns: DecryptionFailed or NotARecipient otherwise (the reader's and writer's own
    exceptions come through as they were raised)."""
    module = pyrage()
    paths = _file_paths(source, target)
    if paths is not None:
        try:
            module.decrypt_file(*paths, list(keys.identities))
        except (module.DecryptError, OSError) as exc:
            raise _os_error_of(exc) or _decryption_error(exc, keys, file, recipients) \
                from None
        return _past_what_pyrage_wrote(target)
    reader, writer = _Source(source.read), _Target(target.write)
    try:
        module.decrypt_io(reader, writer, list(keys.identities))
    except BaseException as exc:
        carried = _carried(reader, writer)
        if carried is not None:
            raise carried from None
        if isinstance(exc, module.DecryptError | OSError):
            raise _decryption_error(exc, keys, file, recipients) from None
        raise
    if writer.failure is not None:
        raise writer.failure
    return writer.count


# -- whole buffers -----------------------------------------------------------------------------
def encrypt_bytes(data: bytes | memoryview, recipients: RecipientSet) -> bytes:
    """The age file of ``data`` for ``recipients`` (whole in memory: a segment, a record)."""
    module = pyrage()
    try:
        encrypted: bytes = module.encrypt(bytes(data), recipient_objects(recipients))
    except module.EncryptError as exc:
        raise _encryption_error(exc) from None
    return encrypted


def decrypt_bytes(data: bytes | memoryview, keys: Keys, *, file: str,
                  recipients: RecipientSet | None = None) -> bytes:
    """The plaintext of the age file ``data`` (never larger than ``data``); DecryptionFailed
    or NotARecipient naming ``file`` when it cannot be decrypted."""
    module = pyrage()
    try:
        plain: bytes = module.decrypt(bytes(data), list(keys.identities))
    except (module.DecryptError, OSError) as exc:
        raise _decryption_error(exc, keys, file, recipients) from None
    return plain


# -- pushed to, pulled from: pyrage in a worker thread -----------------------------------------
class _Closed(Exception):  # noqa: N818 - a state
    """The other side of a :class:`_Pipe` gave up."""


class _Pipe:
    """Bytes from one thread to another, holding at most about ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self._chunks: deque[bytes] = deque()
        self._offset = 0  # into the first chunk
        self._size = 0
        self._limit = limit
        self._ended = self._closed = False
        self._cond = threading.Condition()

    def put(self, chunk: bytes) -> None:
        """Add ``chunk`` once there is room; _Closed when the reader gave up."""
        with self._cond:
            while self._size >= self._limit and not self._closed:
                self._cond.wait()
            if self._closed:
                raise _Closed
            if chunk:
                if not self._chunks:  # the reader may be waiting for it
                    self._cond.notify_all()
                self._chunks.append(chunk)
                self._size += len(chunk)

    def end(self) -> None:
        """No more chunks: the reader gets b"" once it has read them."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def close(self) -> None:
        """Give up: drop what is held; both sides get _Closed from now on."""
        with self._cond:
            self._closed = True
            self._chunks.clear()
            self._size = 0
            self._cond.notify_all()

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes (a chunk's rest when negative), waiting for some; b"" at the
        end; _Closed when the pipe was closed."""
        with self._cond:
            while not self._chunks and not self._ended and not self._closed:
                self._cond.wait()
            if self._closed:
                raise _Closed
            if not self._chunks:
                return b""
            chunk, start = self._chunks[0], self._offset
            stop = len(chunk) if size < 0 else min(len(chunk), start + size)
            piece = chunk if (start, stop) == (0, len(chunk)) else chunk[start:stop]
            if stop == len(chunk):
                self._chunks.popleft()
                self._offset = 0
            else:
                self._offset = stop
            if self._size >= self._limit > self._size - len(piece):  # a writer may wait
                self._cond.notify_all()
            self._size -= len(piece)
            return piece


class _PipeReader:
    """Reads a :class:`_Pipe` a whole chunk at a time (pyrage asks for 8 KiB per call: the
    lock is taken once per chunk, not once per call)."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._held, self._offset = b"", 0

    def read(self, size: int = -1) -> bytes:
        if self._offset == len(self._held):
            self._held, self._offset = self._pipe.read(), 0
        start = self._offset
        stop = len(self._held) if size < 0 else min(len(self._held), start + size)
        self._offset = stop
        return self._held[start:stop]


class _PipeWriter:
    """Writes to a :class:`_Pipe` in pieces of :data:`_PIECE` (pyrage writes 8 KiB per call:
    the lock is taken once per piece); ``close`` puts the rest."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._batch = bytearray()

    def write(self, data: bytes) -> None:
        self._batch += data
        if len(self._batch) >= _PIECE:
            self._pipe.put(bytes(self._batch))
            self._batch.clear()

    def close(self) -> None:
        self._pipe.put(bytes(self._batch))
        self._batch.clear()


class Encryptor:
    """One age file, pushed to: ``update(data)`` returns the encrypted bytes ready so far,
    ``finish()`` the rest (the caller writes them, in order). Memory: :data:`WINDOW` plus what
    one ``update`` is given. ``close()`` (or leaving the ``with`` block) gives an unfinished
    file up. Errors are ArchiveError."""

    def __init__(self, recipients: RecipientSet, *, window: int = WINDOW) -> None:
        module, objects = pyrage(), recipient_objects(recipients)
        self._input = _Pipe(window)
        self._output: list[bytes] = []
        self._lock = threading.Lock()
        self._source = _Source(_PipeReader(self._input).read)
        self._target = _Target(self._collect)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(module, objects),
                                        name="receivewal-encrypt", daemon=True)
        self._thread.start()

    def __enter__(self) -> Encryptor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, module: ModuleType, objects: list[Any]) -> None:
        try:
            module.encrypt_io(self._source, self._target, objects)
        except BaseException as exc:  # handed to the caller's thread  # noqa: BLE001
            self._error = exc
        finally:
            self._input.close()  # nothing more is read: a put waiting for room gives up

    def _collect(self, data: bytes) -> None:
        with self._lock:
            self._output.append(data)

    def _drain(self) -> bytes:
        with self._lock:
            ready, self._output = self._output, []
        return b"".join(ready)

    def _failure(self) -> ArchiveError:
        self._thread.join()
        carried = _carried(self._source, self._target)
        if isinstance(carried, _Closed):
            return ArchiveError("the encryption was given up")
        return _encryption_error(carried or self._error or RuntimeError("it stopped early"))

    def update(self, data: bytes | memoryview) -> bytes:
        """Encrypt ``data`` (copied: the caller may reuse its buffer); the age file's bytes
        that are ready."""
        view = memoryview(data).cast("B")
        ready = []
        for start in range(0, len(view), _PIECE):
            try:
                self._input.put(bytes(view[start:start + _PIECE]))
            except _Closed:
                raise self._failure() from None
            ready.append(self._drain())
        return b"".join(ready)

    def finish(self) -> bytes:
        """End the file: the rest of its bytes."""
        self._input.end()
        self._thread.join()
        if self._error is not None or self._target.failure is not None:
            raise self._failure()
        return self._drain()

    def close(self) -> None:
        """Give the file up if it is not finished; stop the worker."""
        self._input.close()
        self._thread.join()


class _DecryptedStream(io.RawIOBase):
    """The plaintext of an age file, read while pyrage decrypts it in a worker thread."""

    def __init__(self, source: Readable, keys: Keys, file: str,
                 recipients: RecipientSet | None, window: int) -> None:
        super().__init__()
        module = pyrage()
        self._keys, self._file, self._recipients = keys, file, recipients
        self._pipe = _Pipe(window)
        self._batches = _PipeWriter(self._pipe)
        self._source, self._target = _Source(source.read), _Target(self._batches.write)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(module,),
                                        name="receivewal-decrypt", daemon=True)
        self._thread.start()

    def _run(self, module: ModuleType) -> None:
        try:
            module.decrypt_io(self._source, self._target, list(self._keys.identities))
            self._target.write(b"")  # raises what the last flush raised, which pyrage drops
            self._batches.close()
        except BaseException as exc:  # handed to the reading thread  # noqa: BLE001
            self._error = exc
        finally:
            self._pipe.end()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            piece = self._pipe.read(len(buffer))
        except _Closed:
            raise ValueError("read of a closed decrypting reader") from None
        if not piece:
            self._thread.join()
            if self._error is not None or self._target.failure is not None:
                carried = _carried(self._source, self._target)
                raise carried or _decryption_error(
                    self._error or RuntimeError("it stopped early"), self._keys, self._file,
                    self._recipients)
            return 0
        memoryview(buffer).cast("B")[:len(piece)] = piece
        return len(piece)

    def close(self) -> None:
        if not self.closed:
            self._pipe.close()  # a worker waiting for room gives up
            self._thread.join()
        super().close()


def decrypting_reader(source: Readable, keys: Keys, *, file: str,
                      recipients: RecipientSet | None = None, window: int = WINDOW,
                      ) -> BinaryIO:
    """A reader of the plaintext of the age file ``source`` reads (``source`` is read from a
    worker thread until the reader is closed). Its last read raises DecryptionFailed or
    NotARecipient naming ``file`` when the file does not decrypt whole: until a read has
    returned b"", what was read is not known to be the whole file. Memory: ``window``."""
    return io.BufferedReader(_DecryptedStream(source, keys, file, recipients, window), _PIECE)
