"""The pure parts of the compiled receive path (no server): which libpq it binds to, and how
a run of payloads is cut at segment boundaries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from receivewal.archive.layout import take_range
from receivewal.replication.nativerecv import loaded_libpq

BUNDLED = "/venv/lib/python3.11/site-packages/psycopg_binary.libs/libpq-e9b5c9ac.so.5.18"
SYSTEM = "/usr/lib/x86_64-linux-gnu/libpq.so.5.15"


def maps(*paths: str) -> str:
    lines = ["55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]",
             "7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 "]
    for i, path in enumerate(paths):
        lines.append(f"7f1c2b{i:06x}-7f1c2c000000 r-xp 00001000 fd:00 1234{i}     {path}")
        lines.append(f"7f1c2d{i:06x}-7f1c2e000000 r--p 00050000 fd:00 1234{i}     {path}")
    return "\n".join(lines) + "\n"


def test_binds_only_to_the_one_libpq_loaded() -> None:
    """The loop binds to the libpq mapped in the process when there is exactly one."""
    assert loaded_libpq(maps(BUNDLED, "/usr/lib/libssl.so.3")) == BUNDLED
    assert loaded_libpq(maps(SYSTEM)) == SYSTEM
    assert loaded_libpq(maps(BUNDLED, SYSTEM)) is None  # two: which one made the PGconn?
    assert loaded_libpq(maps("/usr/lib/libpqwalreceiver.a.txt")) is None
    assert loaded_libpq(maps()) is None


@given(st.lists(st.binary(max_size=40), max_size=8), st.data())
def test_take_range_is_a_slice_of_the_concatenation(pieces: list[bytes],
                                                    data: st.DataObject) -> None:
    """Any range of a run's pieces, taken as views, is that slice of their concatenation."""
    whole = b"".join(pieces)
    start = data.draw(st.integers(0, len(whole)))
    length = data.draw(st.integers(0, len(whole) - start))
    taken = take_range([memoryview(p) for p in pieces], start, length)
    assert b"".join(taken) == whole[start : start + length]
    assert all(len(view) for view in taken)
