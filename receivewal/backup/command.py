"""The BASE_BACKUP command of PostgreSQL 15 and the result sets around its COPY stream (pure).

PostgreSQL 15 takes the options as a parenthesised list (``BASE_BACKUP ( LABEL 'x', ... )``);
the older keyword form of the seed document is not used. ``TARGET 'client'`` selects the one
COPY stream of :mod:`receivewal.backup.backupstream`. Values are string literals of the
replication grammar (a quote doubled; a backslash is an ordinary character there), numbers are
bare. WAL is never asked for (``WAL false``): the archive holds it.

Before the COPY the server sends two result sets, the start position (``recptr``, ``tli``) and
one row per tablespace (``spcoid``, ``spclocation``, ``size``; the main data directory's row has
NULLs); after it, the end position in the start's shape. Each is read here and checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.archive.compression import CompressSpec
from receivewal.errors import ConfigurationError, ProtocolError, ReceivewalError
from receivewal.replication.commands import quote_literal
from receivewal.replication.link import Row
from receivewal.wal.lsn import parse_lsn
from receivewal.wal.timeline import is_timeline_id

MAX_RATE_LOWER = 32  # kB/s, as basebackup.c bounds MAX_RATE
MAX_RATE_UPPER = 1024 * 1024
CHECKSUM_ALGORITHMS = ("SHA224", "SHA256", "SHA384", "SHA512")  # what the receipt can check


@dataclass(frozen=True)
class BackupRequest:
    """What ``receivewal backup`` asks of the server."""

    label: str = "receivewal base backup"
    fast: bool = False  # CHECKPOINT 'fast' instead of 'spread'
    max_rate: int = 0  # kB/s; 0: no limit
    server_compression: CompressSpec | None = None  # COMPRESSION on the server
    checksum: str = "SHA256"  # MANIFEST_CHECKSUMS
    progress: bool = False  # PROGRESS: sizes in the tablespace rows (an extra pass)
    tablespace_map: bool = True  # TABLESPACE_MAP: the links as a file, not as tar members


@dataclass(frozen=True)
class Position:
    """A position the server reported: an LSN and its timeline."""

    lsn: int
    timeline: int


@dataclass(frozen=True)
class Tablespace:
    """One row of the tablespace result set; ``oid`` None is the main data directory."""

    oid: int | None
    location: str | None
    size_kb: int | None


def base_backup_command(request: BackupRequest) -> str:
    """The BASE_BACKUP command text for ``request``; ConfigurationError for a value the server
    would refuse."""
    if not request.label or len(request.label.encode()) > 1000:
        raise ConfigurationError("a backup label must be 1 to 1000 bytes")
    if request.max_rate and not MAX_RATE_LOWER <= request.max_rate <= MAX_RATE_UPPER:
        raise ConfigurationError(f"transfer rate {request.max_rate} kB/s is out of range "
                                 f"({MAX_RATE_LOWER} kB/s to {MAX_RATE_UPPER} kB/s)")
    if request.checksum not in CHECKSUM_ALGORITHMS:
        raise ConfigurationError(f"manifest checksums {request.checksum!r}: receivewal checks "
                                 f"{', '.join(CHECKSUM_ALGORITHMS)}")
    options = [
        f"LABEL {quote_literal(request.label)}",
        f"CHECKPOINT {quote_literal('fast' if request.fast else 'spread')}",
        "WAL false",
        "WAIT false",  # the archive is receivewal's: nothing for the server to wait for
        "MANIFEST 'yes'",
        f"MANIFEST_CHECKSUMS {quote_literal(request.checksum)}",
        "TARGET 'client'",
    ]
    if request.progress:
        options.append("PROGRESS true")
    if request.tablespace_map:
        options.append("TABLESPACE_MAP true")
    if request.max_rate:
        options.append(f"MAX_RATE {request.max_rate}")
    spec = request.server_compression
    if spec is not None and spec.method:
        options.append(f"COMPRESSION {quote_literal(spec.method)}")
        detail = [f"level={spec.level}"] if spec.level is not None else []
        detail += [f"workers={spec.workers}"] if spec.workers else []
        if detail:
            options.append(f"COMPRESSION_DETAIL {quote_literal(','.join(detail))}")
    return "BASE_BACKUP ( " + ", ".join(options) + " )"


def parse_position(rows: list[Row], what: str) -> Position:
    """The start or end result set: one row of (LSN, timeline)."""
    if len(rows) != 1 or len(rows[0]) < 2 or rows[0][0] is None or rows[0][1] is None:
        raise ProtocolError(f"unexpected {what} result set from BASE_BACKUP: {len(rows)} rows")
    lsn_text, tli_text = rows[0][:2]
    assert lsn_text is not None
    assert tli_text is not None
    try:
        position = Position(parse_lsn(lsn_text), int(tli_text))
    except (ValueError, ReceivewalError):
        raise ProtocolError(f"could not parse the {what} of the base backup: "
                            f"{lsn_text[:40]!r} on timeline {tli_text[:20]!r}") from None
    if not is_timeline_id(position.timeline):
        raise ProtocolError(f"the {what} of the base backup is on timeline "
                            f"{position.timeline}, not a timeline ID")
    return position


def parse_tablespaces(rows: list[Row]) -> list[Tablespace]:
    """The tablespace result set: the main data directory once, each other tablespace once."""
    found: list[Tablespace] = []
    for row in rows:
        if len(row) < 3:
            raise ProtocolError(f"tablespace row of {len(row)} fields from BASE_BACKUP, "
                                "expected 3")
        oid_text, location, size_text = row[:3]
        try:
            oid = None if oid_text is None else int(oid_text)
            size = None if size_text is None else int(size_text)
        except ValueError:
            raise ProtocolError(f"could not parse tablespace row {row!r} from BASE_BACKUP"
                                ) from None
        if (oid is None) != (location is None) or (oid is not None and oid <= 0):
            raise ProtocolError(f"unexpected tablespace row {row!r} from BASE_BACKUP")
        if any(t.oid == oid for t in found):
            raise ProtocolError(f"tablespace {oid or 'pg_default'} listed twice by BASE_BACKUP")
        found.append(Tablespace(oid, location, size))
    if not any(t.oid is None for t in found):
        raise ProtocolError("BASE_BACKUP listed no row for the main data directory")
    return found
