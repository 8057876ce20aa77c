"""The archive's encrypted files (issue 28 §4): a completed file sealed, and sealed files read
back with an identity file or checked without one.

Two forms of a sealed file (issue 34 §2): ``NAME[.zst].FINGERPRINT.age``, one file named for
the recipient set it is sealed to, the set listed once in the archive's identity record (what
``stream`` writes: the record lists the set before anything is sealed to it); and the older
``NAME[.zst].age`` with ``NAME[.zst].age.recipients`` beside it listing the set (what
``backup`` and ``logical`` still write, and archives written before: read as ever).

Sealing (the writers': ``stream`` at a segment's completion; ``backup`` and ``logical`` call
the same pieces): :func:`seal_stream` writes the age file through a temporary file that
:func:`~receivewal.archive.durable.finish_file` names, in bounded memory
(:func:`~receivewal.archive.agestream.encrypt_stream`), in the older form after its
recipients file; :func:`seal_file` turns a completed file ``P`` into ``P.age`` and removes
``P``; the archive's ``adopt_recipients`` records the set in its identity record before
anything is encrypted to it. :class:`Sealing` is what a segment writer is given.

Reading: :class:`Unsealer` holds ``--identity FILE`` (loaded on first use: a call that meets no
encrypted file never imports pyrage) and turns a sealed file's bytes into its plaintext, or
into one error naming the file and the recipients that can read it; :class:`DecryptingOpener`
is an :data:`~receivewal.archive.compression.Opener` (picklable: verify's and analyze's
workers) that decrypts ``*.age`` files as it opens them; :func:`recipients_of` finds a sealed
file's set in either form; :func:`sealed_problem` is the check a reader without a key makes
(the resume scan, the uploader): an age header with as many X25519 stanzas as its set lists.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from receivewal.archive.durable import durable_file, sync_path, write_file_durably
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.reading import Readable, open_regular
from receivewal.archive.recipients import (
    AGE_HEADER_CAP,
    RECIPIENTS_FILE_CAP,
    RecipientsError,
    RecipientSet,
    check_stanzas,
    parse_recipients_file,
    read_age_header,
    recipients_file_text,
)
from receivewal.archive.storedform import Unsealing, unsealed_bytes
from receivewal.errors import ArchiveError, ObjectNotFound
from receivewal.secrets import IDENTITY_ENV
from receivewal.wal.names import ENCRYPTED_SUFFIX, RECIPIENTS_SUFFIX, split_sealed

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from receivewal.archive.compression import Opener
    from receivewal.archive.encryption import Keys
    from receivewal.archive.recipients import AdoptedSet

#: The recipient sets an archive's identity record lists, by fingerprint: what a reader
#: finds a sealed file's set in, the fingerprint its name carries.
KnownSets = dict[str, RecipientSet]



def sealed_cap(segment_size: int) -> int:
    """The most a sealed segment file can hold: its largest compressed form, plus age's header
    and its 16 bytes per 64 KiB chunk."""
    largest = segment_size + segment_size // 64 + 1
    return largest + (largest // (64 << 10) + 1) * 16 + AGE_HEADER_CAP


# -- writing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sealing:
    """What a writer seals completed files with: the recipient set, and the archive's
    identity (a segment is checked against it before it is encrypted: once encrypted,
    nothing on this host can check it)."""

    recipients: RecipientSet
    identity: ArchiveIdentity


def sealed_input(fh: BinaryIO, name: str, segment_size: int, sealing: Sealing,
                 what: str) -> bytes:
    """The bytes of the completed segment file ``name`` (``NAME[.zst]``) open as ``fh``
    (``what`` in messages), read from its start, once its WAL has passed
    :func:`~receivewal.archive.segmentcheck.checked_segment` against the archive's identity:
    what is then sealed. Raises DamagedSegment or CorruptFile naming it, OSError."""
    from receivewal.archive.compression import (  # noqa: PLC0415 - the writer's only
        CorruptFile,
        decompress_chunks,
    )
    from receivewal.archive.segmentcheck import DamagedSegment, checked_segment  # noqa: PLC0415
    from receivewal.wal.names import at_rest_of  # noqa: PLC0415

    fh.seek(0)
    raw = fh.read(segment_size + segment_size // 64 + 1)
    fmt = at_rest_of(name)
    try:
        data = raw if not fmt else b"".join(
            decompress_chunks(io.BytesIO(raw), fmt, cap=segment_size))
        checked_segment(data, name[:24], sealing.identity, file=what)
    except CorruptFile as exc:
        raise CorruptFile(f'"{what}" {exc}: not sealed') from exc
    except DamagedSegment as exc:
        raise exc.refusing("not sealed") from None
    return raw


def recipients_path(path: str | os.PathLike[str]) -> str:
    """Where the recipients file of the encrypted file ``path`` is (a path or a URL)."""
    return os.fspath(path) + RECIPIENTS_SUFFIX


def write_recipients_file(target: Path, recipients: RecipientSet, *, mode: int = 0o600,
                          sync: bool = True) -> None:
    """Write ``target.recipients`` (``target``: an encrypted file, written after this)
    durably. Raises OSError."""
    write_file_durably(target.parent, target.name + RECIPIENTS_SUFFIX,
                       recipients_file_text(recipients), mode=mode, sync=sync)


def seal_stream(source: Readable, target: Path, recipients: RecipientSet, *,
                mode: int = 0o600, sync: bool = True) -> int:
    """Encrypt what ``source`` reads to ``recipients`` as the age file ``target``:
    ``NAME[.zst].FINGERPRINT.age``, named for the set (which the archive's identity record
    lists before anything is sealed to it), or in the older form ``NAME[.zst].age``, its
    recipients file written durably first. ``target`` gets its name only once whole and
    fsynced (a crash leaves a temporary file, or the recipients file alone: both are rewritten
    when the file is sealed again). Memory: constant. Returns the bytes of ``target``. Raises
    OSError, ArchiveError when age refuses."""
    from receivewal.archive.agestream import encrypt_stream  # noqa: PLC0415 - pyrage's user

    assert target.name.endswith(ENCRYPTED_SUFFIX), target
    fingerprint = fingerprint_of(target.name)
    assert fingerprint in ("", recipients.fingerprint), target
    if not fingerprint:
        write_recipients_file(target, recipients, mode=mode, sync=sync)
    with durable_file(target, mode, sync=sync) as out:
        return encrypt_stream(source, out, recipients)


def seal_file(path: Path, recipients: RecipientSet, *, mode: int = 0o600,
              sync: bool = True) -> Path:
    """Seal the completed file ``path`` as ``path.age`` (with ``path.age.recipients``), then
    remove ``path`` and fsync the directory: for a file complete under its own name (a rotated
    change log). Returns the new path. Raises OSError, ArchiveError."""
    target = path.with_name(path.name + ENCRYPTED_SUFFIX)
    with open_regular(path) as fh:
        seal_stream(fh, target, recipients, mode=mode, sync=sync)
    path.unlink()
    sync_path(path.parent, sync=sync)
    return target


# -- reading -----------------------------------------------------------------------------------
def fingerprint_of(path: str) -> str:
    """The fingerprint of the recipient set the sealed file at ``path`` (a path or a URL)
    names; "" for the older form (its set in its recipients file) or a file not sealed."""
    sealed = split_sealed(path.rsplit("/", 1)[-1])
    return "" if sealed is None else sealed[1]


def known_sets(adopted: Iterable[AdoptedSet]) -> KnownSets:
    """The identity record's sets (``ArchiveIdentity.recipient_sets``) by fingerprint."""
    return {a.recipients.fingerprint: a.recipients for a in adopted}


def whom_sealed(file: str, recipients: RecipientSet | None) -> str:
    """Whom the sealed file ``file`` is for, as messages say it (``recipients``: its set,
    None when not at hand)."""
    if recipients is not None:
        return f"encrypted to {recipients.describe()}"
    fingerprint = fingerprint_of(file)
    if fingerprint:
        return (f"encrypted to recipient set {fingerprint}, which the archive's identity "
                "record does not list")
    return "encrypted (its recipients file is missing)"


class NoIdentity(ArchiveError):  # noqa: N818 - reads as what the caller is told
    """An encrypted file, and no identity file to decrypt it with (restore exits 126)."""

    def __init__(self, file: str, recipients: RecipientSet | None) -> None:
        super().__init__(f'"{file}" is {whom_sealed(file, recipients)}: decrypting it needs an '
                         f"identity file holding one of its keys (--identity FILE, or "
                         f"{IDENTITY_ENV})")


def _read_capped(path: str, cap: int, open_binary: Opener | None) -> bytes:
    opener = open_binary or _open_local
    with opener(path) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise ArchiveError(f'"{path}" is larger than {cap} bytes, too large for what it '
                           "should hold")
    return data


def _open_local(path: str) -> BinaryIO:
    return open_regular(Path(path))


def read_recipients(path: str, open_binary: Opener | None = None) -> RecipientSet | None:
    """The set the recipients file of the encrypted file ``path`` lists; None when it has
    none. RecipientsError naming it when it is not a recipients file; OSError or the store's
    error when it cannot be read."""
    where = recipients_path(path)
    try:
        data = _read_capped(where, RECIPIENTS_FILE_CAP, open_binary)
    except (FileNotFoundError, ObjectNotFound):
        return None
    return parse_recipients_file(data, where)


#: The sets of the identity records read beside sealed files, by the folder read: read again
#: when a file names a set they do not list (the record gains a set before a file is sealed
#: to it).
_SETS_BESIDE: dict[str, KnownSets] = {}


def _sets_beside(path: str, open_binary: Opener | None) -> KnownSets:
    """The sets the identity record next to the sealed file ``path`` lists (none without
    one); ArchiveError naming the record when it cannot be read as one."""
    from receivewal.archive.identity import (  # noqa: PLC0415 - a sealed file's reader only
        IDENTITY_CAP,
        IDENTITY_FILE,
        parse_identity_record,
    )

    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    fingerprint = fingerprint_of(path)
    if fingerprint in _SETS_BESIDE.get(folder, {}):
        return _SETS_BESIDE[folder]
    where = f"{folder}/{IDENTITY_FILE}"
    try:
        body = _read_capped(where, IDENTITY_CAP, open_binary)
    except (FileNotFoundError, ObjectNotFound):
        return {}
    sets = known_sets(parse_identity_record(body, where).recipient_sets)
    _SETS_BESIDE[folder] = sets
    return sets


def recipients_of(path: str, open_binary: Opener | None = None,
                  sets: Mapping[str, RecipientSet] | None = None) -> RecipientSet | None:
    """The recipient set of the sealed file ``path``: the one of ``sets`` (the archive's
    identity record's, :func:`known_sets`; None: read from the record next to the file) its
    name's fingerprint names, or in the older form the one its recipients file lists. None
    when neither is there. RecipientsError, OSError or the store's error as
    :func:`read_recipients`."""
    fingerprint = fingerprint_of(path)
    if not fingerprint:
        return read_recipients(path, open_binary)
    listed = sets if sets is not None and fingerprint in sets else \
        _sets_beside(path, open_binary)
    return listed.get(fingerprint)


def sealed_problem(path: str, open_binary: Opener | None = None,
                   sets: Mapping[str, RecipientSet] | None = None) -> str | None:
    """Why the sealed file at ``path`` is not what a writer leaves (a set its name names that
    the identity record does not list, no recipients file, not an age file, stanzas that are
    not its recipients'), or None: the check without a key (``sets``: as
    :func:`recipients_of`)."""
    try:
        recipients = recipients_of(path, open_binary, sets)
        if recipients is None and fingerprint_of(path):
            return (f"is sealed to recipient set {fingerprint_of(path)}, which the archive's "
                    "identity record does not list")
        if recipients is None:
            return f'has no recipients file "{recipients_path(path)}"'
        opener = open_binary or _open_local
        with opener(path) as fh:
            head = fh.read(AGE_HEADER_CAP)
        check_stanzas(read_age_header(head, path), recipients, path)
    except (RecipientsError, ArchiveError) as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None


#: The last file this process decrypted: its bytes and plaintext. A segment is read twice in a
#: row, as the next segment of the one served or scanned before (the record that runs into
#: it) and then as itself: the second time costs a comparison of its bytes, not a decryption.
_LAST_DECRYPTED: dict[tuple[str, str], tuple[bytes, bytes]] = {}


class Unsealer:
    """``--identity FILE`` (None: not given), loaded on first use, to decrypt sealed files."""

    def __init__(self, key_file: str | None,
                 sets: Mapping[str, RecipientSet] | None = None) -> None:
        self.key_file = key_file or None
        self.sets = sets  # the archive's identity record's, when the caller has read it
        self._keys: Keys | None = None

    def keys(self) -> Keys:
        """The identity file's keys (KeyFileError naming it when it cannot be used)."""
        if self.key_file is None:
            raise ArchiveError("no identity file")
        if self._keys is None:
            from receivewal.archive.encryption import load_identity_file  # noqa: PLC0415

            self._keys = load_identity_file(self.key_file)
        return self._keys

    def plaintext(self, raw: bytes, file: str, recipients: RecipientSet | None) -> bytes:
        """The plaintext of the sealed file ``file`` whose bytes are ``raw`` (``recipients``:
        its recipients file's set, None when it has none). NoIdentity without an identity
        file; NotARecipient when it holds none of the file's keys (said before decrypting);
        DecryptionFailed for a damaged file."""
        if self.key_file is None:
            raise NoIdentity(file, recipients)
        keys = self.keys()
        if recipients is not None:
            keys.require(recipients, file=file)
        last = _LAST_DECRYPTED.get((self.key_file, file))
        if last is not None and last[0] == raw:  # the same bytes, decrypted a moment ago
            return last[1]
        plain = unsealed_bytes(raw, Unsealing(keys, file, recipients))
        _LAST_DECRYPTED.clear()
        _LAST_DECRYPTED[self.key_file, file] = raw, plain
        return plain

    def opened(self, path: str, cap: int, open_binary: Opener | None = None,
               source: BinaryIO | None = None) -> BinaryIO:
        """The plaintext of the sealed file at ``path`` (read through ``source`` when given,
        else opened by ``open_binary``), at most ``cap`` bytes of it read, as a reader."""
        recipients = recipients_of(path, open_binary, self.sets)
        if self.key_file is None:
            raise NoIdentity(path, recipients)
        if source is not None:
            raw = source.read(cap + 1)
            if len(raw) > cap:
                raise ArchiveError(f'"{path}" is larger than {cap} bytes, too large for a '
                                   "sealed segment")
        else:
            raw = _read_capped(path, cap, open_binary)
        return io.BytesIO(self.plaintext(raw, path, recipients))


class DecryptingOpener:
    """An opener of an archive's files that hands out the plaintext of sealed ones (``*.age``,
    at most ``cap`` bytes read) and opens the others as ``open_binary`` does. Picklable (the
    identity file is loaded in each process that opens a sealed file)."""

    def __init__(self, open_binary: Opener | None, key_file: str | None, cap: int) -> None:
        self.open_binary, self.key_file, self.cap = open_binary, key_file, cap
        self._unsealer: Unsealer | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"open_binary": self.open_binary, "key_file": self.key_file, "cap": self.cap,
                "_unsealer": None}

    def __call__(self, path: str) -> BinaryIO:
        if not path.endswith(ENCRYPTED_SUFFIX):
            return (self.open_binary or _open_local)(path)
        if self._unsealer is None:
            self._unsealer = Unsealer(self.key_file)
        try:
            return self._unsealer.opened(path, self.cap, self.open_binary)
        except NoIdentity:  # no key: what can be checked without one is checked
            problem = sealed_problem(path, self.open_binary)
            if problem is None:
                raise
            raise ArchiveError(f'"{path}" {problem}') from None
