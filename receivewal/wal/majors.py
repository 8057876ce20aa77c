"""The PostgreSQL majors receivewal reads and writes (pure data): the one place that knows what
changes between them.

Of the format facts the WAL readers assume, only the page magic (``XLOG_PAGE_MAGIC`` of
``xlog_internal.h``) differs from 15 to 18. Checked and the same in each: the page headers
(short and long), the record header (``XLogRecord``, 24 bytes) and its block references, the
resource manager ids of ``rmgrlist.h`` (0 to 21, custom 128 to 255), the XLOG record kinds the
checks recognise (switch, checkpoints, end of recovery, overwritten contrecord: 17 adds
``XLOG_CHECKPOINT_REDO``, which nothing here reads), the longest record a reader accepts, the
timeline history format, and the BASE_BACKUP options receivewal sends (15's option list). 17
and 18 write backup manifests of version 2, which add ``System-Identifier``: backup/manifest.py
reads both versions.

Where an archive's major comes from: the magic of a segment's first page says it (every page of
a segment carries its first page's magic). Nothing records it, and nothing needs to: an archive
holds one database system (the system identifier of its identity record, checked by the daemon,
restore and verify), and a system never changes major in place (pg_upgrade makes a new one), so
archives written before this module read as they are. A segment of a major not listed here is
refused with one line naming its magic and the majors known. A server says its major when a
connection starts (``server_version``); :func:`server_major_problem` refuses one not listed.

On restore's lean path (imported by :mod:`receivewal.wal.pageheader`): plain data, no imports.
"""

from __future__ import annotations

#: XLOG_PAGE_MAGIC of each PostgreSQL major receivewal knows, oldest first
PAGE_MAGICS: dict[int, int] = {15: 0xD110, 16: 0xD113, 17: 0xD116, 18: 0xD118}
#: the major that writes each magic
MAJOR_OF_MAGIC: dict[int, int] = {magic: major for major, magic in PAGE_MAGICS.items()}
OLDEST_MAJOR = min(PAGE_MAGICS)
NEWEST_MAJOR = max(PAGE_MAGICS)


def known_majors() -> str:
    """The majors known and their magics, as the refusals name them:
    ``15 (D110), 16 (D113), 17 (D116), 18 (D118)``."""
    return ", ".join(f"{major} ({magic:04X})" for major, magic in PAGE_MAGICS.items())


def magic_problem(magic: int, expected: int | None = None) -> str:
    """What is wrong with a page's magic ("" when nothing): ``expected`` is the magic of the
    segment's first page (None: the page is a first page, and its magic must be a known
    major's)."""
    if expected is None:
        if magic in MAJOR_OF_MAGIC:
            return ""
        return (f"invalid magic number {magic:04X}: not the WAL of a PostgreSQL major "
                f"receivewal knows ({known_majors()})")
    if magic == expected:
        return ""
    major = MAJOR_OF_MAGIC.get(expected)
    return (f"invalid magic number {magic:04X}, expected {expected:04X}"
            + (f" (PostgreSQL {major}, as the segment's first page)" if major else ""))


def server_major_problem(server_version: int) -> str | None:
    """Why receivewal cannot take a server of ``server_version`` (e.g. 170010), or None."""
    major = server_version // 10000
    if major in PAGE_MAGICS:
        return None
    return (f"the server is PostgreSQL {major}; this receivewal knows the WAL of PostgreSQL "
            f"{OLDEST_MAJOR} to {NEWEST_MAJOR}")
