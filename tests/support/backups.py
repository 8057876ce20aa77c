"""What the backup tests share: synthetic tars, manifests and BASE_BACKUP streams, a recording
of a real server's stream, and a link that plays a recording back."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import signal
import struct
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from receivewal.archive.compression import parse_compress_option
from receivewal.backup.command import BackupRequest
from receivewal.backup.record import BackupRecord
from receivewal.backup.transfer import BackupLink, take_backup
from receivewal.replication.commands import ServerInfo, identify_server
from receivewal.replication.connection import ReplicationConnection, build_conninfo
from receivewal.replication.link import COPY_DONE, CopyData, CopyDone, Result, ResultStatus, Row
from receivewal.wal.lsn import format_lsn
from support.servers import PgServer, pg_bin


def make_tar(files: Sequence[tuple[str, bytes]], *, dirs: Sequence[str] = (),
             fmt: int = tarfile.USTAR_FORMAT, mtime: int = 1_700_000_000) -> bytes:
    """A tar archive of ``dirs`` and ``files`` (name, content) as ``tarfile`` writes it, ended
    by its two zero blocks (no padding to a 10 kB record, as PostgreSQL sends it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as archive:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, mtime
            archive.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, mtime
            archive.addfile(info, io.BytesIO(data))
        members_end = archive.offset
    return out.getvalue()[:members_end] + bytes(1024)


def ustar_header(name: str, size: int, *, typeflag: bytes = b"0", linkname: str = "",
                 size_field: bytes | None = None, prefix: str = "") -> bytes:
    """One ustar header block built by hand (for what ``tarfile`` does not write)."""
    block = bytearray(512)
    block[0:len(name)] = name.encode()
    block[100:108] = b"0000600\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = size_field if size_field is not None else f"{size:011o}\0".encode()
    block[136:148] = b"14540000000\0"
    block[156:157] = typeflag
    block[157:157 + len(linkname)] = linkname.encode()
    block[257:265] = b"ustar\x0000"
    block[345:345 + len(prefix)] = prefix.encode()
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    return bytes(block)


def make_manifest(files: Sequence[tuple[str, bytes]], *, timeline: int = 1,
                  start: int = 0x2000028, end: int = 0x2000100,
                  checksums: bool = True) -> bytes:
    """A manifest in PostgreSQL 15's layout for ``files``, with its own checksum."""
    lines = ['{ "PostgreSQL-Backup-Manifest-Version": 1,', '"Files": [']
    entries = []
    for name, data in files:
        entry = {"Path": name, "Size": len(data), "Last-Modified": "2024-01-01 00:00:00 GMT"}
        if checksums:
            entry |= {"Checksum-Algorithm": "SHA256",
                      "Checksum": hashlib.sha256(data).hexdigest()}
        entries.append("{ " + json.dumps(entry)[1:-1] + " }")
    lines.append(",\n".join(entries))
    lines.append("],")
    lines.append('"WAL-Ranges": [')
    lines.append(f'{{ "Timeline": {timeline}, "Start-LSN": "{format_lsn(start)}", '
                 f'"End-LSN": "{format_lsn(end)}" }}')
    lines.append("],")
    body = ("\n".join(lines) + "\n").encode()
    return body + f'"Manifest-Checksum": "{hashlib.sha256(body).hexdigest()}"}}\n'.encode()


def new_archive(name: str, location: str = "") -> bytes:
    """An 'n' message."""
    return b"n" + name.encode() + b"\0" + location.encode() + b"\0"


def data_messages(data: bytes, piece: int = 32768) -> list[bytes]:
    """'d' messages carrying ``data`` in pieces."""
    return [b"d" + data[at:at + piece] for at in range(0, len(data), piece)]


def progress(done: int) -> bytes:
    """A 'p' message."""
    return b"p" + struct.pack(">q", done)


def stream_of(archives: Sequence[tuple[str, str, bytes]], manifest: bytes) -> list[bytes]:
    """A whole COPY stream: each (name, location, bytes) archive, then the manifest."""
    messages: list[bytes] = []
    sent = 0
    for name, location, data in archives:
        messages.append(new_archive(name, location))
        messages += data_messages(data)
        sent += len(data)
        messages.append(progress(sent))
    messages.append(b"m")
    messages += data_messages(manifest)
    return messages


@dataclass
class Recording:
    """What a server answered to BASE_BACKUP: the result sets before the COPY, its payloads,
    and the end position's rows."""

    before: list[list[Row]]
    payloads: list[bytes]
    end_rows: list[Row]


@dataclass
class PlayedLink:
    """A BackupLink that plays a recording back (``payloads`` may be altered first)."""

    recording: Recording
    commands: list[str] = field(default_factory=list)
    _payloads: Iterator[bytes] | None = None
    _results: list[Result | None] = field(default_factory=list)

    def start_copy_out(self, sql: str) -> list[list[Row]]:
        self.commands.append(sql)
        self._payloads = iter(self.recording.payloads)
        self._results = [Result(ResultStatus.TUPLES_OK, self.recording.end_rows),
                         Result(ResultStatus.COMMAND_OK, []), None]
        return self.recording.before

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None:
        assert self._payloads is not None
        return next(self._payloads, COPY_DONE)

    def next_result(self) -> Result | None:
        return self._results.pop(0)


@dataclass
class RecordingLink:
    """A BackupLink around a real connection that keeps what it passes on."""

    link: object
    recording: Recording = field(default_factory=lambda: Recording([], [], []))

    def start_copy_out(self, sql: str) -> list[list[Row]]:
        before: list[list[Row]] = self.link.start_copy_out(sql)  # type: ignore[attr-defined]
        self.recording.before = before
        return before

    def read_copy(self, timeout: float) -> CopyData | CopyDone | None:
        got: CopyData | CopyDone | None = self.link.read_copy(timeout)  # type: ignore[attr-defined]
        if isinstance(got, bytes | memoryview):
            self.recording.payloads.append(bytes(got))
        return got

    def next_result(self) -> Result | None:
        result: Result | None = self.link.next_result()  # type: ignore[attr-defined]
        if result is not None and result.status is ResultStatus.TUPLES_OK:
            self.recording.end_rows = result.rows
        return result


# -- real servers --------------------------------------------------------------------------------
def pgbench(pg: PgServer, *args: str) -> list[str]:
    """pgbench's command line against ``pg`` (as the postgres superuser, over TCP)."""
    return [pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
            *args, "postgres"]


def start_pgbench(pg: PgServer, seconds: int) -> subprocess.Popen[bytes]:
    """pgbench's TPC-B-like load for ``seconds`` in the background (initialised already)."""
    return subprocess.Popen(pgbench(pg, "-n", "-c", "2", "-T", str(seconds)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def add_tablespace(pg: PgServer, name: str) -> Path:
    """A tablespace of ``pg`` in a directory of its own, with a table of 2,000 rows."""
    location = pg.base / name
    location.mkdir()
    shutil.chown(location, "postgres", "postgres")
    pg.sql(f"CREATE TABLESPACE {name} LOCATION '{location}'")
    pg.sql(f"CREATE TABLE {name}_rows (n int) TABLESPACE {name}")
    pg.sql(f"INSERT INTO {name}_rows SELECT generate_series(1, 2000)")
    return location


@contextlib.contextmanager
def replication_link(pg: PgServer) -> Iterator[ReplicationConnection]:
    """A replication connection to ``pg``, closed afterwards."""
    conn = ReplicationConnection.open(build_conninfo(pg.dsn))
    try:
        yield conn
    finally:
        conn.close()


def give_to_postgres(*paths: Path) -> None:
    """chown -R postgres: what the server user must own (a data directory, a tablespace)."""
    for path in paths:
        subprocess.run(["chown", "-R", "postgres:postgres", str(path)], check=True)


def verifybackup(pgdata: Path, manifest: Path, *ignored: str) -> subprocess.CompletedProcess[str]:
    """pg_verifybackup of an unpacked data directory against ``manifest`` (the WAL not
    parsed: the archive holds it), ``ignored`` files left out."""
    ignore = [arg for name in ignored for arg in ("-i", name)]
    return subprocess.run([pg_bin("pg_verifybackup"), "-n", *ignore, "-m", str(manifest),
                           str(pgdata)], capture_output=True, text=True, check=False)


def loaded_primary(base: Path) -> tuple[PgServer, Path]:
    """A started primary in ``base`` (1 MiB segments: WAL is cheap) with the tablespace
    ``ts`` and pgbench's tables (scale 1); the server and the tablespace's directory."""
    pg = PgServer(base, "primary")
    pg.init(initdb_args=("--wal-segsize=1",))
    pg.start()
    tablespace = add_tablespace(pg, "ts")
    subprocess.run(pgbench(pg, "-i", "-q", "-s", "1"), check=True, capture_output=True)
    return pg, tablespace


def backup_under_load(pg: PgServer, archive: Path, label: str, compress: str,
                      recorder: Callable[[BackupLink], BackupLink] = lambda link: link,
                      ) -> tuple[ServerInfo, BackupRecord]:
    """A backup of ``pg`` into ``archive`` taken while pgbench writes (checked: pgbench still
    ran when the backup ended, and it succeeded); ``recorder`` may wrap the link."""
    load = start_pgbench(pg, 600)  # stopped once the backup is taken, however long it took
    try:
        time.sleep(1)
        with replication_link(pg) as conn:
            server = identify_server(conn)
            record = take_backup(recorder(conn), BackupRequest(label=label, fast=True), archive,
                                 server, compress=parse_compress_option(compress))
        assert load.poll() is None, "pgbench was still writing when the backup ended"
    finally:
        load.send_signal(signal.SIGINT)
        load.wait(timeout=30)
    said = load.stderr.read().decode(errors="replace") if load.stderr else ""
    assert "error" not in said.lower(), said
    assert "aborted" not in said, said
    return server, record


def start_recovered(base: Path, name: str, timeout: float = 120,
                    major: int | None = None) -> PgServer:
    """Start the recovered data directory ``base/name`` (its own port and socket directory,
    set after the settings the backup brought; PostgreSQL ``major``, default 15) and wait
    until recovery has ended."""
    server = PgServer(base, name, major)
    server.configure({})
    server.sockdir.mkdir()
    give_to_postgres(server.sockdir)
    server.start_or_fail()
    deadline = time.monotonic() + timeout
    while server.sql("SELECT pg_is_in_recovery()") != "f":
        if time.monotonic() > deadline:
            server.stop("immediate")
            raise AssertionError(f"recovery of {name} did not end")
        time.sleep(0.2)
    return server
