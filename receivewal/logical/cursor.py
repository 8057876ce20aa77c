"""A cursor over one logical decoding message (pure): the only reader of its bytes.

Both output plugins send big-endian integers and C strings inside a CopyData payload, as
PostgreSQL's ``pq_getmsg*`` functions read them. Every read checks that the bytes are there;
a message that ends early, a string without its terminating zero byte, or bytes left over
after the last field is a :class:`~receivewal.errors.ProtocolError` naming the plugin, the
message and the LSN it came at. Nothing is guessed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from receivewal.errors import ProtocolError
from receivewal.logical.outputmessages import TupleData
from receivewal.wal.lsn import format_lsn

_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class MessageReader:
    """Reads the fields of one message in order. ``what`` names the plugin and the message
    (e.g. ``"pgoutput Insert"``) for errors; ``lsn`` is where the server sent it; reading
    starts at ``start`` (past the message type byte)."""

    __slots__ = ("_data", "_pos", "lsn", "what")

    def __init__(self, data: bytes, lsn: int, what: str, start: int = 0) -> None:
        self._data = data
        self._pos = start
        self.lsn = lsn
        self.what = what

    def error(self, problem: str) -> ProtocolError:
        """The project's protocol error for this message: ``problem`` with what and where."""
        return ProtocolError(f"{self.what} at {format_lsn(self.lsn)}: {problem}")

    def tell(self) -> tuple[bytes, int]:
        """The message's bytes and where the next field starts: for a reader of many small
        fields in one go (a row's columns), which :meth:`seek` past them when it read them
        all without a problem, and leaves to the field readers (and their errors) otherwise."""
        return self._data, self._pos

    def seek(self, position: int) -> None:
        """Continue at ``position`` (after :meth:`tell`'s reader, within the message)."""
        if not self._pos <= position <= len(self._data):
            raise ValueError(f"cannot seek to {position}")
        self._pos = position

    @property
    def remaining(self) -> int:
        """How many bytes are left unread."""
        return len(self._data) - self._pos

    def _take(self, size: int, field: str) -> int:
        start = self._pos
        if size < 0 or start + size > len(self._data):
            raise self.error(f"message ends inside its {field} ({len(self._data)} bytes, "
                             f"{start + size} needed)")
        self._pos = start + size
        return start

    def byte(self, field: str) -> int:
        """One unsigned byte (Int8, Byte1)."""
        return self._data[self._take(1, field)]

    def char(self, field: str) -> str:
        """One byte read as a character (a kind or an action byte: ``'N'``, ``'t'``...)."""
        return chr(self._data[self._take(1, field)])

    def u16(self, field: str) -> int:
        """An unsigned 16-bit integer."""
        return int(_U16.unpack_from(self._data, self._take(2, field))[0])

    def i16(self, field: str) -> int:
        """A signed 16-bit integer."""
        return int(_I16.unpack_from(self._data, self._take(2, field))[0])

    def u32(self, field: str) -> int:
        """An unsigned 32-bit integer (an xid, an OID, a length)."""
        return int(_U32.unpack_from(self._data, self._take(4, field))[0])

    def i32(self, field: str) -> int:
        """A signed 32-bit integer (a type modifier, a value length)."""
        return int(_I32.unpack_from(self._data, self._take(4, field))[0])

    def u64(self, field: str) -> int:
        """An unsigned 64-bit integer (an LSN)."""
        return int(_U64.unpack_from(self._data, self._take(8, field))[0])

    def i64(self, field: str) -> int:
        """A signed 64-bit integer (a timestamp: microseconds since 2000-01-01 UTC)."""
        return int(_I64.unpack_from(self._data, self._take(8, field))[0])

    def raw(self, size: int, field: str) -> bytes:
        """``size`` bytes as they are."""
        start = self._take(size, field)
        return self._data[start:start + size]

    def cstring(self, field: str) -> str:
        """A string ended by a zero byte (PostgreSQL's ``pq_sendstring``), as UTF-8."""
        end = self._data.find(b"\0", self._pos)
        if end < 0:
            raise self.error(f"message ends inside its {field} (no terminating zero byte)")
        start, self._pos = self._pos, end + 1
        return self.text(self._data[start:end], field)

    def counted_cstring(self, size: int, field: str) -> str:
        """``size`` bytes whose last one is the zero byte that ends the string (pglogical's
        names: the length counts the terminator)."""
        data = self.raw(size, field)
        if not data or data[-1] != 0 or b"\0" in data[:-1]:
            raise self.error(f"its {field} is not a string of {size - 1} bytes ended by a "
                             "zero byte")
        return self.text(data[:-1], field)

    def text(self, data: bytes, field: str) -> str:
        """``data`` decoded as UTF-8 (the replication connection's client encoding)."""
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise self.error(f"its {field} is not valid UTF-8 ({exc.reason} at byte "
                             f"{exc.start})") from None

    def expect(self, wanted: str, what: str) -> None:
        """One byte that must be ``wanted`` (an action or block byte), named ``what``."""
        got = self.char(what)
        if got != wanted:
            raise self.error(f"expected the {what} ({wanted!r}), got {got!r}")

    def no_flags(self) -> None:
        """A flags byte of which no bit is defined (the plugins reserve them all)."""
        flags = self.byte("flags")
        if flags:
            raise self.error(f"unknown flags {flags:#x}")

    def update_tuples(self, read: Callable[[MessageReader], TupleData],
                      ) -> tuple[str | None, TupleData | None, TupleData]:
        """An Update's tuples, as both plugins send them: the old key (``K``) or old row
        (``O``) if any, then the new row (``N``); each read by ``read``."""
        action = self.char("tuple kind")
        old_kind, old = None, None
        if action in "KO":
            old_kind, old = action, read(self)
            action = self.char("tuple kind")
        if action != "N":
            raise self.error(f"expected the new tuple ('N'), got {action!r}")
        return old_kind, old, read(self)

    def delete_tuple(self, read: Callable[[MessageReader], TupleData]) -> tuple[str, TupleData]:
        """A Delete's old key (``K``) or old row (``O``), read by ``read``."""
        kind = self.char("tuple kind")
        if kind not in "KO":
            raise self.error(f"expected the old key ('K') or old tuple ('O'), got {kind!r}")
        return kind, read(self)

    def end(self) -> None:
        """The message must be over: bytes after its last field are an error."""
        if self._pos != len(self._data):
            raise self.error(f"{len(self._data) - self._pos} unexpected bytes after its last "
                             "field")
