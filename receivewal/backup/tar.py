"""A streaming reader of the tar archives PostgreSQL writes (pure).

BASE_BACKUP sends each tablespace as a ustar archive (POSIX 1003.1-2008), in pieces of any
size: :class:`TarReader` is fed them and yields each member's header, its data as views of
what it was fed (never gathered), and its end. It holds at most one header block, or one
pax/GNU extended header of at most :data:`EXTENDED_CAP` bytes: memory stays bounded whatever
the archive's size.

What it reads: ustar headers (``ustar\\0`` ``00``, and GNU's ``ustar  \\0``), their checksum
(unsigned, or signed as some old writers computed it), octal numbers and the base-256 form
PostgreSQL's ``print_tar_number`` uses for large values, the ``prefix`` field, pax extended
headers (``path``, ``linkpath``, ``size``; global ones are read and ignored) and GNU long
names. Members are regular files, directories and symbolic links, which is all PostgreSQL
writes; any other kind is refused. A name is given without its ``./`` and trailing ``/``; an
absolute name or one with a ``..`` step is refused. The tar must end with its two zero
blocks (PostgreSQL 15 sends them); zeros may follow them, nothing else.

Every problem is a :class:`TarError` naming the archive and the byte offset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from receivewal.errors import ArchiveError

BLOCK = 512
EXTENDED_CAP = 1 << 20  # a pax or GNU extended header's data held in memory, at most
_ZERO_BLOCK = bytes(BLOCK)
_MAGICS = (b"ustar\x0000", b"ustar  \x00")
_FILE_TYPES = {b"0": "file", b"\x00": "file", b"7": "file", b"5": "directory",
               b"2": "symlink"}
_EXTENDED_TYPES = (b"x", b"g", b"L", b"K")


class TarError(ArchiveError):
    """A tar archive that cannot be read: a damaged header, an unsupported member, a bad
    name, or an end in the wrong place."""


class MemberKind(Enum):
    """The kinds of member PostgreSQL's archives hold."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class TarMember:
    """A member's header: ``name`` normalised, ``linkname`` for a symbolic link."""

    name: str
    kind: MemberKind
    size: int
    mode: int
    mtime: int
    linkname: str = ""


@dataclass(frozen=True, slots=True)
class MemberStart:
    """A member begins (its data follows in :class:`MemberData` events)."""

    member: TarMember


@dataclass(frozen=True, slots=True)
class MemberData:
    """A piece of the current member's data: a view of what was fed, valid until the next
    piece is fed."""

    data: memoryview


@dataclass(frozen=True, slots=True)
class MemberEnd:
    """The current member's data is complete."""

    member: TarMember


TarEvent = MemberStart | MemberData | MemberEnd


def _number(field: bytes, what: str) -> int:
    """A numeric header field: octal digits (spaces and zero bytes around them), or base-256
    when the first byte has its high bit set (positive values only)."""
    if field and field[0] & 0x80:
        if field[0] != 0x80:
            raise ValueError(f"negative or oversized base-256 {what}")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if text.strip(b"01234567"):
        raise ValueError(f"{what} field {field!r} is not octal")
    return int(text, 8)


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _header_checksum_ok(block: bytes) -> bool:
    recorded = _number(block[148:156], "checksum")
    plain = block[:148] + b" " * 8 + block[156:]
    unsigned = sum(plain)
    if recorded == unsigned:  # what every writer of our time computes: the signed sum unasked
        return True
    return recorded == unsigned - 256 * sum(1 for byte in plain if byte & 0x80)


def _check_header(block: bytes) -> None:
    if not _header_checksum_ok(block):
        raise ValueError("header checksum mismatch")
    if block[257:265] not in _MAGICS:
        raise ValueError("not a ustar header")


def normalised_name(raw: str) -> str:
    """A member name without ``./`` steps and trailing slashes; ValueError for an empty,
    absolute or ``..`` name."""
    if raw.startswith("/"):
        raise ValueError(f"absolute member name {raw[:120]!r}")
    steps = [step for step in raw.split("/") if step not in ("", ".")]
    if not steps or ".." in steps or "\0" in raw:
        raise ValueError(f"unsafe member name {raw[:120]!r}")
    return "/".join(steps)


class _State(Enum):
    HEADER = 1
    EXTENDED = 2
    DATA = 3
    PADDING = 4
    SECOND_ZERO = 5
    ENDED = 6


class TarReader:
    """Feed a tar's bytes in pieces; get its members (see the module's docstring).

    ``where`` names the tar in errors.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.offset = 0  # bytes of the tar consumed
        self._state = _State.HEADER
        self._block = bytearray()
        self._left = 0  # bytes of data, extended header or padding still to come
        self._pad = 0
        self._member: TarMember | None = None
        self._extended_type = b""
        self._extended = bytearray()
        self._overrides: dict[str, str] = {}

    @property
    def ended(self) -> bool:
        """Whether the end-of-archive blocks have been read."""
        return self._state is _State.ENDED

    def _error(self, problem: str) -> TarError:
        return TarError(f"{self.where}: {problem} (at byte {self.offset})")

    def feed(self, data: bytes | memoryview) -> Iterator[TarEvent]:
        """The events of ``data``, the archive's next bytes."""
        view = memoryview(data).cast("B")
        while view:
            state = self._state
            if state is _State.DATA:
                take = min(self._left, len(view))
                piece, view = view[:take], view[take:]
                self._left -= take
                self.offset += take
                yield MemberData(piece)
                if not self._left:
                    yield from self._end_of_data()
            elif state is _State.PADDING or state is _State.EXTENDED:
                view = self._skip_or_collect(view)
            elif state is _State.ENDED:
                if any(view):
                    raise self._error("data after the end-of-archive blocks")
                self.offset += len(view)
                view = view[len(view):]
            else:
                take = min(BLOCK - len(self._block), len(view))
                self._block += view[:take]
                view = view[take:]
                self.offset += take
                if len(self._block) == BLOCK:
                    block, self._block = bytes(self._block), bytearray()
                    yield from self._header(block)

    def take_data(self, data: bytes | memoryview) -> bool:
        """Whether ``data``, the archive's next bytes, lies wholly inside the current
        member's data, short of its end; it is then consumed at once, and the caller takes it
        as that member's :class:`MemberData` (no event is made). False (nothing consumed):
        :meth:`feed` reads it. The bulk of a large file passes so, one call per piece."""
        if self._state is not _State.DATA or len(data) >= self._left:
            return False
        self._left -= len(data)
        self.offset += len(data)
        return True

    def close(self) -> None:
        """The tar has no more bytes: it must have ended with its two zero blocks."""
        if self._state is _State.SECOND_ZERO:
            raise self._error("archive ends after one of its two end-of-archive blocks")
        if self._state is not _State.ENDED:
            if self._member is not None or self._state is not _State.HEADER or self._block:
                raise self._error("archive ends inside a member")
            raise self._error("archive ends without its end-of-archive blocks")

    # -- states ------------------------------------------------------------------------------
    def _skip_or_collect(self, view: memoryview) -> memoryview:
        take = min(self._left, len(view))
        if self._state is _State.EXTENDED:
            self._extended += view[:take]
        self._left -= take
        self.offset += take
        if not self._left:
            if self._state is _State.EXTENDED:
                self._state, self._left = _State.PADDING, self._pad
                self._apply_extended()
            if not self._left:
                self._state = _State.HEADER
        return view[take:]

    def _end_of_data(self) -> Iterator[TarEvent]:
        member, self._member = self._member, None
        assert member is not None
        self._state, self._left = (_State.PADDING, self._pad) if self._pad else (_State.HEADER, 0)
        yield MemberEnd(member)

    def _header(self, block: bytes) -> Iterator[TarEvent]:
        if self._state is _State.SECOND_ZERO:
            if block != _ZERO_BLOCK:
                raise self._error("a zero block not followed by another")
            self._state = _State.ENDED
            return
        if block == _ZERO_BLOCK:
            if self._overrides:
                raise self._error("extended header not followed by a member")
            self._state = _State.SECOND_ZERO
            return
        try:
            _check_header(block)
            size = _number(block[124:136], "size")
            typeflag = block[156:157]
            if typeflag in _EXTENDED_TYPES:
                self._begin_extended(typeflag, size)
                return
            member = self._member_of(block, typeflag, size)
        except ValueError as exc:
            raise self._error(str(exc)) from None
        self._pad = -member.size % BLOCK
        yield MemberStart(member)
        if member.size:
            self._member, self._state, self._left = member, _State.DATA, member.size
        else:
            self._member = member
            yield from self._end_of_data()

    def _member_of(self, block: bytes, typeflag: bytes, size: int) -> TarMember:
        kind = _FILE_TYPES.get(typeflag)
        if kind is None:
            raise ValueError(f"unsupported member type {typeflag!r} (PostgreSQL writes "
                             "files, directories and symbolic links)")
        overrides, self._overrides = self._overrides, {}
        name = _text(block[0:100])
        prefix = _text(block[345:500])
        if prefix:
            name = prefix + "/" + name
        name = normalised_name(overrides.get("path", name))
        if "size" in overrides:
            size = int(overrides["size"])
        if kind != "file" and size:
            raise ValueError(f"{kind} {name!r} with {size} bytes of data")
        linkname = overrides.get("linkpath", _text(block[157:257]))
        if kind == "symlink" and not linkname:
            raise ValueError(f"symbolic link {name!r} without a target")
        return TarMember(name, MemberKind(kind), size, _number(block[100:108], "mode") & 0o7777,
                         _number(block[136:148], "mtime"), linkname if kind == "symlink" else "")

    def _begin_extended(self, typeflag: bytes, size: int) -> None:
        if size > EXTENDED_CAP:
            raise ValueError(f"extended header of {size} bytes (at most {EXTENDED_CAP})")
        self._extended_type, self._extended = typeflag, bytearray()
        self._pad = -size % BLOCK
        self._state, self._left = _State.EXTENDED, size
        if not size:
            self._apply_extended()
            self._state, self._left = _State.PADDING, self._pad
            if not self._left:
                self._state = _State.HEADER

    def _apply_extended(self) -> None:
        data = bytes(self._extended)
        self._extended = bytearray()
        try:
            if self._extended_type == b"L":
                self._overrides["path"] = _text(data)
            elif self._extended_type == b"K":
                self._overrides["linkpath"] = _text(data)
            else:
                records = _pax_records(data)
                if self._extended_type == b"x":
                    self._overrides.update(records)
        except ValueError as exc:
            raise self._error(str(exc)) from None


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``"%d %s=%s\\n"`` records of a pax extended header that this reader uses."""
    found: dict[str, str] = {}
    at = 0
    while at < len(data):
        space = data.find(b" ", at, at + 21)
        if space < 0 or not data[at:space].isdigit():
            raise ValueError("malformed pax extended header record")
        length = int(data[at:space])
        record = data[space + 1:at + length]
        if length <= space - at + 1 or at + length > len(data) or not record.endswith(b"\n") \
                or b"=" not in record:
            raise ValueError("malformed pax extended header record")
        key, _, value = record[:-1].partition(b"=")
        if key in (b"path", b"linkpath"):
            found[key.decode()] = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            if not value.isdigit():
                raise ValueError(f"pax size {value[:30]!r} is not a number")
            found["size"] = value.decode()
        at += length
    return found
