"""The recover half of issue 28 against a real PostgreSQL 15: a backup taken while pgbench
writes, unpacked by receivewal into a new data directory (its tablespace moved), started with
restore_command pointing at an archive of the server's WAL through ``receivewal restore``,
reaches a target time between two transactions: the rows before it are there, the row after
it is not. And a data directory that is not empty is refused."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from support.backups import (
    backup_under_load,
    give_to_postgres,
    loaded_primary,
    start_recovered,
)
from support.postgres_user import install_for_postgres, readable_by_postgres
from support.recovery import complete_segments
from support.servers import PgServer, make_shared_dir

from receivewal.archive.compression import decompress_chunks, new_compressor, parse_compress_option
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import read_catalog
from receivewal.backup.manifest import BackupMismatch
from receivewal.backup.record import BackupRecord
from receivewal.backup.stored import stored_manifest, verify_backup
from receivewal.errors import ArchiveError
from receivewal.recovery.choice import choose_backup, time_target
from receivewal.recovery.recoveryconf import recovery_settings, restore_command, start_instructions
from receivewal.recovery.unpack import unpack_backup, write_recovery

pytestmark = pytest.mark.server

SEGMENT = 1 << 20


@dataclass
class Setup:
    base: Path
    archive: Path  # the WAL archive, with backups/ in it
    tablespace: Path
    record: BackupRecord
    target: datetime  # between the two marker rows
    history_rows: str  # pgbench_history's count(*) when pgbench had finished
    command: str  # restore_command's prefix, runnable by the server user


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    base = make_shared_dir("receivewal-recover-")
    pg: PgServer | None = None
    try:
        pg, tablespace = loaded_primary(base)
        archive = base / "archive"
        archive.mkdir()
        server, record = backup_under_load(pg, archive, "pitr", "lz4")
        history_rows = pg.sql("SELECT count(*) FROM pgbench_history")
        pg.sql("CREATE TABLE marker (what text) TABLESPACE ts")
        pg.sql("INSERT INTO marker VALUES ('before')")
        time.sleep(1.1)
        target = time_target(pg.sql("SELECT clock_timestamp()")).time
        time.sleep(1.1)
        pg.sql("INSERT INTO marker VALUES ('after')")
        pg.switch_wal()
        pg.stop()
        for segment in complete_segments(pg):
            shutil.copy(segment, archive / segment.name)
        (archive / ".receivewal-archive.json").write_text(json.dumps(
            {"system_identifier": server.system_identifier, "wal_segment_size": SEGMENT,
             "timeline": 1}))
        readable_by_postgres(archive)
        assert target is not None
        yield Setup(base, archive, tablespace, record, target, history_rows,
                    install_for_postgres(base))
    finally:
        if pg is not None:
            pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def test_recovery_to_a_time_between_two_transactions(setup: Setup) -> None:
    """The chosen backup is the one taken under load; unpacked into a new data directory and a
    new tablespace directory, recovery stops at the target: 'before' and every pgbench
    transaction are there, 'after' is not, and the server was promoted."""
    target = time_target(setup.target.isoformat())
    records = [e.record for e in read_catalog(setup.archive) if e.record is not None]
    present = {name for name in (p.name for p in setup.archive.iterdir()) if len(name) == 24}
    choice = choose_backup(records, target, 1, {}, system_identifier=setup.record
                           .system_identifier, has_wal=present.__contains__)
    assert choice.record == setup.record

    pgdata, moved = setup.base / "recovered", setup.base / "ts-recovered"
    unpacked = unpack_backup(setup.archive / BACKUPS / setup.record.backup_id, choice.record,
                             pgdata, mapping={str(setup.tablespace): str(moved)})
    command = restore_command(setup.command, str(setup.archive))
    write_recovery(pgdata, recovery_settings(target, "promote", command))
    assert (pgdata / "recovery.signal").exists()
    auto_conf = (pgdata / "postgresql.auto.conf").read_text()
    assert f"recovery_target_time = '{setup.target.isoformat()}'" in auto_conf
    assert "recovery_target_action = 'promote'" in auto_conf
    instructions = start_instructions(pgdata, list(unpacked.tablespaces.values()))
    assert f"pg_ctl -D {pgdata}" in instructions
    give_to_postgres(pgdata, moved)

    server = start_recovered(setup.base, "recovered")
    try:
        assert server.sql("SELECT string_agg(what, ',') FROM marker") == "before"
        assert server.sql("SELECT count(*) FROM pgbench_history") == setup.history_rows
        assert server.sql("SELECT count(*) FROM ts_rows") == "2000"
        assert server.sql("SELECT spcname, pg_tablespace_location(oid) FROM pg_tablespace "
                          "WHERE spcname = 'ts'") == f"ts|{moved}"
        log = server.logfile.read_text()
        assert "recovery stopping before commit" in log
        first = setup.record.wal_segments()[0]
        assert f'restored log file "{first}" from archive' in log  # through receivewal restore
    finally:
        server.stop("immediate")


def test_a_target_before_the_backup_ends_has_no_backup(setup: Setup) -> None:
    """A target time before the only backup ended: none is chosen, and the error says why."""
    records = [e.record for e in read_catalog(setup.archive) if e.record is not None]
    early = time_target(setup.record.start_time.isoformat())
    with pytest.raises(ArchiveError, match=f"{setup.record.backup_id} ends at .*after the "
                                           "target time"):
        choose_backup(records, early, 1, {})


def test_a_data_directory_that_is_not_empty_is_refused(setup: Setup, tmp_path: Path) -> None:
    (tmp_path / "pgdata").mkdir()
    (tmp_path / "pgdata" / "PG_VERSION").write_text("15\n")
    with pytest.raises(ArchiveError, match="is not empty"):
        unpack_backup(setup.archive / BACKUPS / setup.record.backup_id, setup.record,
                      tmp_path / "pgdata", mapping={str(setup.tablespace): str(tmp_path / "t")})
    assert [p.name for p in (tmp_path / "pgdata").iterdir()] == ["PG_VERSION"]
    with pytest.raises(ArchiveError, match=r"tablespace directory .* is not empty"):
        unpack_backup(setup.archive / BACKUPS / setup.record.backup_id, setup.record,
                      tmp_path / "new")


def test_a_backup_damaged_at_rest_is_refused_naming_the_file(setup: Setup,
                                                             tmp_path: Path) -> None:
    """A copy of the backup whose base.tar.lz4 says '16' in PG_VERSION: verifying it names
    the file (the manifest's checksum differs), and so does unpacking it, which also says
    what it left behind. The backup itself verifies."""
    source = setup.archive / BACKUPS / setup.record.backup_id
    copy = tmp_path / "backup"
    shutil.copytree(source, copy)
    with (source / "base.tar.lz4").open("rb") as fh:
        tar = b"".join(decompress_chunks(fh, "lz4"))
    at = tar.index(b"15\n", tar.index(b"PG_VERSION"))
    compressor = new_compressor(parse_compress_option("lz4"))
    (copy / "base.tar.lz4").write_bytes(
        compressor.begin() + compressor.compress(tar[:at] + b"16" + tar[at + 2:])
        + compressor.finish())
    verified = verify_backup(source, setup.record)
    assert verified.files == len(stored_manifest(source, setup.record).files)
    with pytest.raises(BackupMismatch, match=r'^backup \w+ does not match its manifest: '
                                             r'"PG_VERSION" has SHA256 checksum \w+ as stored'):
        verify_backup(copy, setup.record)
    with pytest.raises(BackupMismatch, match=r'"PG_VERSION" has SHA256 checksum .* left '
                                             r"incomplete: remove before recovering again"):
        unpack_backup(copy, setup.record, tmp_path / "pgdata",
                      mapping={str(setup.tablespace): str(tmp_path / "ts")}, sync=False)
