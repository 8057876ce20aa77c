"""The local copy's rule (``stream --upload-to URL --keep-local AGE|SIZE``), pure: what the
archive directory of a daemon that uploads keeps (what the bucket lacks, what a slot or a
backup needs, the newest segment, the window) and what it removes; --keep-local's values."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from receivewal.archive.keeplocal import KeepLocal, parse_keep_local
from receivewal.backup.catalog import BackupEntry, EntryState
from receivewal.backup.record import BackupRecord, StoredArchive, WalSpan
from receivewal.daemon.settings import Settings
from receivewal.errors import ConfigurationError
from receivewal.retention.localrule import LocalFile, plan_local
from receivewal.retention.plan import ArchiveContents
from receivewal.wal.names import history_file_name, wal_file_name

SEG = 16 << 20
NOW = 1_000_000.0
URL = "s3://wal/db1"


def seg(timeline: int, segno: int, suffix: str = "") -> str:
    return wal_file_name(timeline, segno, SEG) + suffix


#: timeline 1's segments 1 to 10, one completed each hour (segment 10 the newest), the
#: .partial of 11, the identity record and the state file
SEGMENTS = [seg(1, n) for n in range(1, 11)]
FILES = {**{name: LocalFile(SEG, NOW - 3600 * (10 - n)) for n, name in enumerate(SEGMENTS, 1)},
         seg(1, 11, ".partial"): LocalFile(SEG, NOW),
         ".receivewal-archive.json": LocalFile(200, NOW - 36000),
         ".receivewal-state.json": LocalFile(900, NOW)}


def contents(*, backlog: tuple[str, ...] = (), slot: int | None = None,
             entries: tuple[BackupEntry, ...] = (), destination: str = URL,
             files: list[str] | None = None, current: int = 1) -> ArchiveContents:
    return ArchiveContents(entries, list(FILES) if files is None else files, {}, current, SEG,
                           slot, frozenset(backlog), destination)


def removed(plan_files: tuple[object, ...]) -> list[str]:
    return [v.name for v in plan_files if v.remove]  # type: ignore[attr-defined]


def test_a_size_window_keeps_the_newest_segments_that_fit_and_removes_the_rest() -> None:
    rule = parse_keep_local("40MB")
    assert rule is not None
    plan = plan_local(contents(), rule, FILES, NOW)
    assert removed(plan.files) == SEGMENTS[:8]
    assert plan.window_files == 1  # segment 9; segment 10 stays as the newest
    assert plan.held_files == 5  # two segments, the .partial, the two records
    assert plan.held_bytes == 3 * SEG + 1100


def test_an_age_window_keeps_the_segments_completed_within_it() -> None:
    plan = plan_local(contents(), KeepLocal("150m", seconds=9000), FILES, NOW)
    assert removed(plan.files) == SEGMENTS[:7]


def test_a_segment_still_to_upload_is_never_removed_whatever_its_age() -> None:
    plan = plan_local(contents(backlog=(SEGMENTS[0], SEGMENTS[4])), KeepLocal("1s", seconds=1),
                      FILES, NOW)
    assert removed(plan.files) == [SEGMENTS[n] for n in (1, 2, 3, 5, 6, 7, 8)]
    reasons = {v.name: v.reason for v in plan.files}
    assert reasons[SEGMENTS[0]] == f"waiting for its upload to {URL}"
    assert reasons[SEGMENTS[9]] == "the newest segment: the next start resumes after it"


def test_nothing_is_removed_without_an_upload_destination() -> None:
    plan = plan_local(contents(destination=""), KeepLocal("1s", seconds=1), FILES, NOW)
    assert removed(plan.files) == []


def test_the_slots_wal_stays() -> None:
    plan = plan_local(contents(slot=6 * SEG + 100), KeepLocal("1s", seconds=1), FILES, NOW)
    assert removed(plan.files) == SEGMENTS[:5]


def test_a_backup_being_written_into_the_directory_holds_every_segment() -> None:
    entries = (BackupEntry("20240601T120000Z", EntryState.RUNNING),)
    plan = plan_local(contents(entries=entries), KeepLocal("1s", seconds=1), FILES, NOW)
    assert removed(plan.files) == []
    assert plan.files[0].reason == "backup 20240601T120000Z is being written into the directory"


def test_an_interrupted_backup_holds_nothing() -> None:
    entries = (BackupEntry("20240601T120000Z", EntryState.INTERRUPTED),)
    plan = plan_local(contents(entries=entries), KeepLocal("1s", seconds=1), FILES, NOW)
    assert removed(plan.files) == SEGMENTS[:9]


def test_a_sealed_segment_goes_with_its_recipients_file_and_history_files_stay() -> None:
    sealed = {seg(1, 1, ".age"): LocalFile(SEG, NOW - 7200),
              seg(1, 1, ".age.recipients"): LocalFile(100, NOW - 7200),
              seg(1, 2, ".age"): LocalFile(SEG, NOW),
              seg(1, 2, ".age.recipients"): LocalFile(100, NOW),
              history_file_name(2): LocalFile(50, NOW - 7200)}
    unknown = plan_local(contents(files=list(sealed), current=2),
                         KeepLocal("1h", seconds=3600), sealed, NOW)
    assert removed(unknown.files) == []  # the current timeline's line is unknown
    assert unknown.files[0].reason == ("the history file of the current timeline 2 is "
                                       "missing: its line is unknown")
    plan = plan_local(ArchiveContents((), list(sealed), {2: []}, 2, SEG, None, frozenset(),
                                      URL), KeepLocal("1h", seconds=3600), sealed, NOW)
    assert removed(plan.files) == [seg(1, 1, ".age"), seg(1, 1, ".age.recipients")]


@pytest.mark.parametrize(("text", "seconds", "size"), [
    ("36h", 36 * 3600, None), ("90m", 5400, None), ("7d", 7 * 86400, None),
    ("30s", 30, None), ("10GB", None, 10 << 30), ("500mb", None, 500 << 20),
    ("1.5TB", None, int(1.5 * (1 << 40))), ("64kB", None, 64 << 10)])
def test_keep_local_takes_an_age_or_a_size(text: str, seconds: float | None,
                                           size: int | None) -> None:
    assert parse_keep_local(text) == KeepLocal(text, seconds, size)


@pytest.mark.parametrize("text", ["all", "ALL", "", None])
def test_keep_local_all_turns_the_rule_off(text: str | None) -> None:
    assert parse_keep_local(text) is None


@pytest.mark.parametrize("text", ["10", "10XB", "-5h", "0GB", "h", "1e9GB", "ten days"])
def test_a_bad_keep_local_is_one_clear_line(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r'^invalid --keep-local ".*": "all", an age') \
            as caught:
        parse_keep_local(text)
    assert "\n" not in str(caught.value)


def test_keep_local_without_upload_to_is_refused() -> None:
    settings = Settings(directory=Path("/srv/wal"), conninfo="", keep_local=KeepLocal("24h", 86400))
    with pytest.raises(ConfigurationError, match="--keep-local 24h needs --upload-to"):
        settings.validate()


def test_a_complete_backup_in_the_directory_keeps_its_wal() -> None:
    """A backup kept in the directory (cleanup's to expire) keeps the WAL it recovers from:
    its start's segment and everything after it on the current timeline."""
    start, end = 4 * SEG + 40, 5 * SEG + 256
    record = BackupRecord(
        backup_id="20240601T120000Z", label="l", system_identifier="7", server_version=150018,
        wal_segment_size=SEG, timeline=1, start_lsn=start, end_timeline=1, end_lsn=end,
        start_time=datetime(2024, 6, 1, 11, 55, tzinfo=UTC),
        end_time=datetime(2024, 6, 1, 12, 0, tzinfo=UTC),
        archives=(StoredArchive("base.tar.zst", None, "", "zstd", 10, 20),),
        wal_spans=(WalSpan(1, start, end),), manifest_name="backup_manifest",
        manifest_sha256="0" * 64, database_bytes=20)
    entries = (BackupEntry(record.backup_id, EntryState.COMPLETE, record),)
    plan = plan_local(contents(entries=entries), KeepLocal("1s", seconds=1), FILES, NOW)
    assert removed(plan.files) == SEGMENTS[:3]
    reasons = {v.name: v.reason for v in plan.files}
    assert reasons[SEGMENTS[4]].startswith("backup 20240601T120000Z (from 0/4000028 on ")
