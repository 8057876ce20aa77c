"""The pure decisions of issue 28, on hand-built archives: which backup a recovery starts
from, the recovery settings, what retention removes and keeps (following timeline history),
and pg_archivecleanup's rule."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from receivewal.archive.lock import lock_directory
from receivewal.backup.backupdir import BACKUPS
from receivewal.backup.catalog import BackupEntry, EntryState, proven, read_catalog
from receivewal.backup.record import (
    RECORD_NAME,
    BackupRecord,
    StoredArchive,
    WalSpan,
    absent_files,
    record_from_json,
    record_to_json,
)
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.recovery.choice import (
    RecoveryTarget,
    TargetKind,
    choose_backup,
    lsn_target,
    name_target,
    time_target,
    xid_target,
)
from receivewal.recovery.recoveryconf import (
    RECOVERY_SETTINGS,
    auto_conf_lines,
    include_directives,
    quote_setting,
    recovery_lines,
    recovery_settings,
    restore_command,
    without_recovery_settings,
)
from receivewal.recovery.unpack import tablespace_map_entries
from receivewal.retention.archivecleanup import oldest_kept_name, plan_archive_cleanup
from receivewal.retention.plan import (
    ArchiveContents,
    KeepBackups,
    RecoveryWindow,
    plan_retention,
)
from receivewal.wal.names import history_file_name, wal_file_name
from receivewal.wal.timeline import TimelineSwitch

SEG = 16 << 20
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def seg(timeline: int, segno: int, suffix: str = "") -> str:
    return wal_file_name(timeline, segno, SEG) + suffix


def record(backup_id: str, start_seg: float, end_seg: float, *, timeline: int = 1,
           ended: datetime = NOW, sysid: str = "7") -> BackupRecord:
    start, end = int(start_seg * SEG) + 40, int(end_seg * SEG) + 256
    return BackupRecord(
        backup_id=backup_id, label="l", system_identifier=sysid, server_version=150018,
        wal_segment_size=SEG, timeline=timeline, start_lsn=start, end_timeline=timeline,
        end_lsn=end, start_time=ended - timedelta(minutes=5), end_time=ended,
        archives=(StoredArchive("base.tar.zst", None, "", "zstd", 10, 20),),
        wal_spans=(WalSpan(timeline, start, end),), manifest_name="backup_manifest",
        manifest_sha256="0" * 64, database_bytes=20)


def complete(*records: BackupRecord) -> list[BackupEntry]:
    return [BackupEntry(r.backup_id, EntryState.COMPLETE, r) for r in records]


#: timeline 2 forked off timeline 1 at the start of segment 8
HISTORY_2 = {2: [TimelineSwitch(1, 8 * SEG)]}


# -- the record --------------------------------------------------------------------------------
def test_a_record_round_trips_and_names_its_wal() -> None:
    rec = record("20240601T120000Z", 5, 6.5)
    assert record_from_json(record_to_json(rec), "backup.json") == rec
    assert rec.wal_segments() == [seg(1, 5), seg(1, 6)]


@pytest.mark.parametrize(("old", "new", "complaint"), [
    (b'"format": 1', b'"format": 2', "not a backup record of format 1"),
    (b'"timeline": 1', b'"timeline": "1"', "'timeline' is not a count"),
    (b'"start_lsn": "0/5000028"', b'"start_lsn": "5000028"', "LSN"),
    (b'"wal_segment_size": 16777216', b'"wal_segment_size": 1000', "segment size"),
    (b'"end_lsn": "0/6800100"', b'"end_lsn": "0/10"', "ends before it starts"),
    (b'"database_bytes": 20', b'"size": 20', "missing field 'database_bytes'"),
])
def test_a_damaged_record_is_named(old: bytes, new: bytes, complaint: str) -> None:
    data = record_to_json(record("x", 5, 6.5))
    assert old in data
    with pytest.raises(ArchiveError, match=f"backup.json: .*{complaint}"):
        record_from_json(data.replace(old, new, 1), "backup.json")


# -- choosing a backup -------------------------------------------------------------------------
B_OLD = record("old", 2, 3, ended=NOW - timedelta(days=2))
B_MID = record("mid", 5, 6, ended=NOW - timedelta(days=1))
B_NEW = record("new", 9, 10, timeline=2, ended=NOW)


def test_the_newest_backup_on_the_line_is_taken_without_a_target() -> None:
    choice = choose_backup([B_OLD, B_NEW, B_MID], RecoveryTarget(), 2, HISTORY_2)
    assert choice.record is B_NEW
    assert choice.passed_over == []


def test_a_time_or_lsn_target_takes_the_newest_backup_ending_before_it() -> None:
    between = time_target((NOW - timedelta(hours=12)).isoformat())
    choice = choose_backup([B_OLD, B_NEW, B_MID], between, 2, HISTORY_2)
    assert choice.record is B_MID
    assert choice.passed_over == [("new", f"ends at {NOW.isoformat()}, after the target time")]
    assert choose_backup([B_OLD, B_MID], lsn_target(f"0/{4 * SEG:X}"), 1, {}).record is B_OLD
    with pytest.raises(ArchiveError, match=r"no backup to recover to LSN 0/1000000 .* old ends "
                                           r"at 0/3000100, after the target LSN"):
        choose_backup([B_OLD], lsn_target("0/1000000"), 1, {})


def test_xid_and_name_targets_take_the_newest_backup() -> None:
    for target in (xid_target("1234"), name_target("before upgrade")):
        assert choose_backup([B_OLD, B_MID], target, 1, {}).record is B_MID


def test_a_backup_off_the_target_timelines_line_is_passed_over() -> None:
    """Timeline 2 left timeline 1 at segment 8: a timeline-1 backup that ends after that is
    not on timeline 2's line; without timeline 2's history, no timeline-1 backup is."""
    late_on_1 = record("late", 8.5, 9)
    choice = choose_backup([late_on_1, B_MID], RecoveryTarget(), 2, HISTORY_2)
    assert choice.record is B_MID
    assert choice.passed_over == [("late", "ends at 0/9000100 on timeline 1, after timeline 2 "
                                           "left it at 0/8000000")]
    with pytest.raises(ArchiveError, match="no history file of timeline 2"):
        choose_backup([B_MID], RecoveryTarget(), 2, {})
    assert choose_backup([late_on_1, B_MID], RecoveryTarget(), 1, HISTORY_2).record is late_on_1


def test_a_backup_whose_wal_is_missing_or_of_another_system_is_passed_over() -> None:
    present = {seg(1, 2), seg(1, 3), seg(1, 5)}
    choice = choose_backup([B_OLD, B_MID], RecoveryTarget(), 1, {}, has_wal=present.__contains__)
    assert choice.record is B_OLD
    assert choice.passed_over == [("mid", f"the archive lacks 1 of the WAL segments it needs "
                                          f"(the first is {seg(1, 6)})")]
    other = record("other", 7, 8, sysid="8")
    assert choose_backup([other, B_MID], RecoveryTarget(), 1, {},
                         system_identifier="7").record is B_MID


@pytest.mark.parametrize(("make", "text"), [
    (time_target, "2024-06-01 12:00"), (time_target, "yesterday"), (lsn_target, "0/x"),
    (xid_target, "-1"), (xid_target, "2"), (name_target, ""), (name_target, "x" * 64),
])
def test_bad_targets_are_refused(make: object, text: str) -> None:
    with pytest.raises(ConfigurationError):
        make(text)  # type: ignore[operator]


# -- the recovery settings ---------------------------------------------------------------------
def test_restore_command_quotes_the_archive_for_the_shell_and_postgresql() -> None:
    assert restore_command("receivewal restore", "/srv/my archive/100%") == \
        "receivewal restore -D '/srv/my archive/100%%' %f %p"


def test_settings_for_each_kind_of_target() -> None:
    """Every recovery setting is written: the target's kind last of the kinds (PostgreSQL
    refuses a second kind set after another), the others empty, so that nothing the backup's
    configuration holds decides the recovery."""
    cmd = "receivewal restore -D /a %f %p"
    empty = [("recovery_end_command", ""), ("archive_cleanup_command", ""),
             ("primary_conninfo", ""), ("primary_slot_name", "")]
    assert recovery_settings(RecoveryTarget(), "pause", cmd) == [
        ("restore_command", cmd), *empty, ("recovery_target", ""),
        ("recovery_target_time", ""), ("recovery_target_xid", ""),
        ("recovery_target_lsn", ""), ("recovery_target_name", ""),
        ("recovery_target_inclusive", "on"), ("recovery_target_timeline", "latest"),
        ("recovery_target_action", "promote")]
    assert recovery_settings(time_target("2024-06-01 12:00:00+02"), "promote", cmd) == [
        ("restore_command", cmd), *empty, ("recovery_target", ""),
        ("recovery_target_xid", ""), ("recovery_target_lsn", ""),
        ("recovery_target_name", ""), ("recovery_target_time", "2024-06-01T10:00:00+00:00"),
        ("recovery_target_inclusive", "on"), ("recovery_target_timeline", "latest"),
        ("recovery_target_action", "promote")]
    assert recovery_settings(lsn_target("0/16B3748"), "shutdown", cmd)[9] == \
        ("recovery_target_lsn", "0/16B3748")
    assert recovery_settings(xid_target("777"), "pause", cmd)[9] == ("recovery_target_xid", "777")
    assert recovery_settings(name_target("it's"), "pause", cmd)[9] == \
        ("recovery_target_name", "it's")
    assert recovery_settings(RecoveryTarget(TargetKind.IMMEDIATE, timeline=3), "pause",
                             cmd)[9:] == [("recovery_target", "immediate"),
                                          ("recovery_target_inclusive", "on"),
                                          ("recovery_target_timeline", "3"),
                                          ("recovery_target_action", "pause")]
    settings = recovery_settings(RecoveryTarget(), "pause", cmd)
    assert sorted(name for name, _ in settings) == sorted(RECOVERY_SETTINGS)
    with pytest.raises(ConfigurationError, match="target action"):
        recovery_settings(RecoveryTarget(), "resume", cmd)


def test_inherited_recovery_settings_are_removed_from_postgresql_auto_conf() -> None:
    """Every line that sets a recovery setting (any spelling of its name, with or without
    '='), and an earlier recover's mark, go; the other lines stay as they were."""
    text = ("# Do not edit this file manually!\nwork_mem = '8MB'\n"
            "# added by receivewal recover\nrestore_command = 'old %f %p'\n"
            "Recovery_Target_Time = '2001-02-03 04:05:06+00'\nrecovery_target_action "
            "'promote'\nprimary_slot_name='s'\nrecovery_target_timeline=1\n"
            "restore_command_extra = 'x'\n")
    kept, removed = without_recovery_settings(text)
    assert kept == "# Do not edit this file manually!\nwork_mem = '8MB'\n" \
        "restore_command_extra = 'x'\n"
    assert removed == ["restore_command = 'old %f %p'",
                       "Recovery_Target_Time = '2001-02-03 04:05:06+00'",
                       "recovery_target_action 'promote'", "primary_slot_name='s'",
                       "recovery_target_timeline=1"]
    assert recovery_lines(text)[0] == (4, "restore_command = 'old %f %p'")
    assert include_directives("include 'a.conf' # x\ninclude_dir=conf.d\n"
                              "INCLUDE_IF_EXISTS  'b c.conf'\nincluded = 1\n") == [
        ("include", "a.conf"), ("include_dir", "conf.d"), ("include_if_exists", "b c.conf")]


def test_values_are_quoted_as_alter_system_writes_them() -> None:
    assert quote_setting("it's a \\ path") == "'it''s a \\\\ path'"
    assert auto_conf_lines([("a", "b")]).endswith("a = 'b'\n")
    with pytest.raises(ConfigurationError, match="line break"):
        quote_setting("a\nb")


def test_tablespace_map_lines_are_read_with_their_escapes() -> None:
    assert tablespace_map_entries("16385 /srv/ts\n16386 /srv/a\\\nb\\\\c\n") == [
        ("16385", "/srv/ts"), ("16386", "/srv/a\nb\\c")]
    with pytest.raises(ValueError, match="line break"):
        tablespace_map_entries("16385 /srv/ts")


# -- retention ---------------------------------------------------------------------------------
def contents(entries: list[BackupEntry], files: list[str], *, current: int = 2,
             histories: dict[int, list[TimelineSwitch]] | None = None,
             slot: int | None = None) -> ArchiveContents:
    return ArchiveContents(entries, files, HISTORY_2 if histories is None else histories,
                           current, SEG, slot)


#: timeline 1's segments 1 to 9 (the old primary went on after the fork), timeline 2's from
#: the fork (segment 8) to 12, its .partial, the history file, and what is not WAL
FILES = [*(seg(1, n, ".zst") for n in range(1, 10)), *(seg(2, n) for n in range(8, 13)),
         seg(2, 13, ".partial"), history_file_name(2), ".receivewal-archive.json"]


def verdicts(plan_files: tuple[object, ...]) -> dict[str, bool]:
    return {v.name: v.remove for v in plan_files}  # type: ignore[attr-defined]


def test_a_kept_backup_on_timeline_1_and_the_current_timeline_2_keep_what_they_need() -> None:
    """--keep-backups 1 keeps B_MID (timeline 1, from segment 5): timeline 1's segments from 5
    on (to the fork and after it), all of timeline 2, the .partial and the history file stay;
    only the older backup and timeline 1's segments 1 to 4 go."""
    plan = plan_retention(contents(complete(B_OLD, B_MID), FILES), KeepBackups(1))
    assert plan.removed_backups == ["old"]
    assert plan.removed_files == [seg(1, n, ".zst") for n in range(1, 5)]
    kept = {v.name: v.reason for v in plan.files if not v.remove}
    # what a recovery from B_MID to timeline 2 reads: timeline 1 to the fork, then timeline 2
    for needed in [*(seg(1, n, ".zst") for n in range(5, 8)), *(seg(2, n) for n in range(8, 13))]:
        assert needed in kept, needed
    assert kept[seg(2, 13, ".partial")] == "a .partial"
    assert kept[history_file_name(2)] == "a history file"
    assert kept[seg(1, 6, ".zst")].startswith("backup mid (from 0/5000028 on timeline 1)")
    assert kept[seg(2, 9)].endswith("recovers along timeline 2")
    assert ".receivewal-archive.json" not in verdicts(plan.files)


def test_a_kept_backup_on_timeline_2_lets_timeline_1_go() -> None:
    plan = plan_retention(contents(complete(B_MID, B_NEW), FILES), KeepBackups(1))
    assert plan.removed_backups == ["mid"]
    assert plan.removed_files == [*(seg(1, n, ".zst") for n in range(1, 10)), seg(2, 8)]


def test_a_backup_on_an_abandoned_timeline_1_branch_keeps_its_line_and_the_current_one() -> None:
    """A timeline-1 backup taken after timeline 2 forked off (the old primary went on): its
    timeline's WAL stays from its start, and so does the current timeline's line."""
    late = record("late", 9, 9.5)
    plan = plan_retention(contents(complete(late), FILES), KeepBackups(1))
    assert plan.removed_files == [*(seg(1, n, ".zst") for n in range(1, 9)), seg(2, 8)]


def test_the_slot_and_unknown_histories_keep_their_segments() -> None:
    """The slot restarts in segment 3: 3 and 4 stay. A timeline 3 without its history file
    keeps its segments; when it is the current timeline, nothing at all is removed."""
    files = [*FILES, seg(3, 12), seg(3, 13)]
    plan = plan_retention(contents(complete(B_OLD, B_MID), files, slot=3 * SEG + 100),
                          KeepBackups(1))
    assert plan.removed_files == [seg(1, 1, ".zst"), seg(1, 2, ".zst")]
    reasons = {v.name: v.reason for v in plan.files}
    assert reasons[seg(1, 3, ".zst")] == "the replication slot restarts at 0/3000064"
    asked = plan_retention(replace(contents(complete(B_OLD, B_MID), files, slot=3 * SEG + 100),
                                   slot="archiver"), KeepBackups(1))
    assert asked.removed_files == plan.removed_files
    assert {v.name: v.reason for v in asked.files}[seg(1, 3, ".zst")] == \
        'the replication slot "archiver" restarts at 0/3000064, as its server says'
    assert reasons[seg(3, 12)] == "timeline 3 has no history file: what it needs is unknown"
    blind = plan_retention(contents(complete(B_OLD, B_MID), files, current=3), KeepBackups(1))
    assert blind.removed_backups == ["old"]
    assert blind.removed_files == []
    assert "history file of the current timeline 3 is missing" in blind.files[0].reason


def test_the_recovery_window_keeps_the_backups_inside_it_and_the_last_one_before() -> None:
    backups = [record("d10", 1, 2, ended=NOW - timedelta(days=10)),
               record("d5", 3, 4, ended=NOW - timedelta(days=5)),
               record("d1", 5, 6, ended=NOW - timedelta(days=1))]
    plan = plan_retention(contents(complete(*backups), FILES),
                          RecoveryWindow(timedelta(days=3), NOW))
    assert plan.removed_backups == ["d10"]
    assert plan.removed_files == [seg(1, n, ".zst") for n in range(1, 3)]
    assert {v.name: v.reason for v in plan.backups}["d5"].startswith("needed to recover")


def test_without_a_complete_backup_no_wal_is_removed() -> None:
    entries = [BackupEntry("20261127T034455Z", EntryState.INTERRUPTED),
               BackupEntry("b", EntryState.RUNNING),
               BackupEntry("c", EntryState.DAMAGED, problem="not JSON"),
               BackupEntry("d", EntryState.UNKNOWN)]
    plan = plan_retention(contents(entries, FILES), KeepBackups(2))
    assert plan.removed_backups == ["20261127T034455Z"]
    assert plan.removed_files == []
    assert {v.name: v.reason for v in plan.backups}["c"] == \
        "record unreadable: not JSON: not removed"


def test_a_directory_not_named_as_a_backup_is_never_removed() -> None:
    """An operator's ``backups/manual-copy/`` (files, no record, no lock: what an interrupted
    backup looks like) is no backup of receivewal's: cleanup names it and leaves it."""
    entries = [BackupEntry("manual-copy", EntryState.INTERRUPTED),
               BackupEntry("20261127T034455Z-copy", EntryState.INTERRUPTED),
               BackupEntry("20261127T034455Z-2", EntryState.INTERRUPTED)]
    plan = plan_retention(contents(entries, FILES), KeepBackups(1))
    assert plan.removed_backups == ["20261127T034455Z-2"]
    reasons = {v.name: v.reason for v in plan.backups}
    assert reasons["manual-copy"] == ("not named as receivewal names a backup (an operator's "
                                      "directory?): not removed")


def test_a_backup_whose_files_are_not_all_there_is_never_counted() -> None:
    """A record whose files a listing does not show, each archive of its recorded size, is
    no complete backup (issue 32 §1): retention keeps the newest backup that is there and its
    WAL, and when none is, removes nothing."""
    new = record("new", 9, 10)
    listing = {"base.tar.zst": 10, "backup_manifest": 300}
    assert proven(complete(new)[0], listing).state is EntryState.COMPLETE
    gone = proven(complete(new)[0], {"backup_manifest": 300})
    cut = proven(complete(new)[0], {**listing, "base.tar.zst": 4})
    assert (gone.state, gone.record, gone.problem) == (
        EntryState.INCOMPLETE, None, "base.tar.zst is missing")
    assert cut.problem == "base.tar.zst holds 4 bytes, its record says 10"
    assert proven(complete(new)[0], {"base.tar.zst": 10}).problem == \
        "backup_manifest is missing"
    sealed = replace(new, encrypted_to=("age1x",), manifest_name="backup_manifest.age")
    assert absent_files(sealed, {"base.tar.zst": 10, "backup_manifest.age": 9}) == (
        "base.tar.zst.recipients is missing; backup_manifest.age.recipients is missing")

    plan = plan_retention(contents([*complete(B_OLD, B_MID), gone], FILES), KeepBackups(1))
    assert plan.removed_backups == ["old"]
    assert plan.kept == (B_MID,)
    assert {v.name: v.reason for v in plan.backups}["new"] == (
        "not counted as a backup, its record is there, not all its files: base.tar.zst is "
        "missing: not removed")
    nothing = plan_retention(contents([gone], FILES), KeepBackups(1))
    assert nothing.removed_backups == []
    assert nothing.removed_files == []
    assert "no complete backup: nothing is removed" in {v.reason for v in nothing.files}


def test_a_policy_that_keeps_nothing_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        plan_retention(contents(complete(B_MID), FILES), KeepBackups(0))
    with pytest.raises(ConfigurationError):
        plan_retention(contents(complete(B_MID), FILES), RecoveryWindow(timedelta(0), NOW))


#: the same archive sealed (``stream --encrypt-to``): each complete segment ``F.age`` (after
#: its compression suffix) with ``F.age.recipients`` beside it; the .partial stays as written
SEALED = [*(name for n in range(1, 10) for name in (seg(1, n, ".zst.age"),
                                                   seg(1, n, ".zst.age.recipients"))),
          *(name for n in range(8, 13) for name in (seg(2, n, ".age"),
                                                   seg(2, n, ".age.recipients"))),
          seg(2, 13, ".partial"), history_file_name(2), ".receivewal-archive.json"]


def test_sealed_segments_and_their_recipients_files_are_judged_as_plain_ones() -> None:
    """Issue 31 §3 / 32 §8: the plan of a sealed archive is the plain one's, each segment's
    recipients file going (or staying) with it, for the same reason."""
    plain = plan_retention(contents(complete(B_MID, B_NEW), FILES), KeepBackups(1))
    sealed = plan_retention(contents(complete(B_MID, B_NEW), SEALED), KeepBackups(1))
    assert sealed.removed_backups == ["mid"]
    assert sealed.removed_files == [
        *(name for n in range(1, 10) for name in (seg(1, n, ".zst.age"),
                                                  seg(1, n, ".zst.age.recipients"))),
        seg(2, 8, ".age"), seg(2, 8, ".age.recipients")]
    reasons = {v.name: v.reason for v in sealed.files}
    for verdict in plain.files:
        if len(verdict.name.split(".")[0]) == 24 and not verdict.name.endswith(".partial"):
            sealed_name = verdict.name.removesuffix(".zst") + (
                ".zst.age" if verdict.name.startswith("00000001") else ".age")
            assert reasons[sealed_name] == reasons[sealed_name + ".recipients"] == \
                verdict.reason
    assert reasons[seg(2, 13, ".partial")] == "a .partial"


def test_a_sealed_segment_waiting_for_its_upload_keeps_its_recipients_file() -> None:
    """The backlog names ``F.age``: its recipients file stays with it; a recipients file left
    alone (its segment removed by a cleanup cut short) goes as its segment would."""
    files = [name for name in SEALED if name != seg(1, 2, ".zst.age")]
    backlog = frozenset({seg(1, 3, ".zst.age")})
    plan = plan_retention(
        ArchiveContents(complete(B_MID, B_NEW), files, HISTORY_2, 2, SEG, None, backlog,
                        "s3://b/p"), KeepBackups(1))
    reasons = {v.name: (v.remove, v.reason) for v in plan.files}
    assert reasons[seg(1, 3, ".zst.age")] == reasons[seg(1, 3, ".zst.age.recipients")] == \
        (False, "waiting for its upload to s3://b/p")
    assert reasons[seg(1, 2, ".zst.age.recipients")][0] is True


# -- pg_archivecleanup's rule ------------------------------------------------------------------
def test_archive_cleanup_removes_what_sorts_before_the_oldest_kept_file() -> None:
    plan = plan_archive_cleanup(FILES, seg(2, 9))
    assert [v.name for v in plan if v.remove] == \
        [*(seg(1, n, ".zst") for n in range(1, 9)), seg(2, 8)]
    assert {v.name: v.remove for v in plan}[seg(2, 13, ".partial")] is False
    assert history_file_name(2) not in {v.name for v in plan}


def test_archive_cleanup_removes_sealed_segments_with_their_recipients_files() -> None:
    """``cleanup -D DIR %r`` on a sealed archive: ``F.age`` and ``F.age.recipients`` are
    judged as ``F``."""
    plan = plan_archive_cleanup(SEALED, seg(2, 9))
    assert [v.name for v in plan if v.remove] == [
        *(name for n in range(1, 9) for name in (seg(1, n, ".zst.age"),
                                                 seg(1, n, ".zst.age.recipients"))),
        seg(2, 8, ".age"), seg(2, 8, ".age.recipients")]
    assert {v.name: v.remove for v in plan}[seg(2, 9, ".age.recipients")] is False


@pytest.mark.parametrize(("argument", "name"), [
    ("000000010000000000000005", "000000010000000000000005"),
    ("000000010000000000000005.partial", "000000010000000000000005"),
    ("000000010000000000000005.zst", "000000010000000000000005"),
    ("000000010000000000000005.00000028.backup", "000000010000000000000005"),
])
def test_archive_cleanup_takes_pg_archivecleanups_arguments(argument: str, name: str) -> None:
    assert oldest_kept_name(argument) == name


@pytest.mark.parametrize("argument", ["", "00000002.history", "0000000100000000000000",
                                      "../000000010000000000000005", "x" * 24])
def test_archive_cleanup_refuses_other_arguments(argument: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid file name argument"):
        oldest_kept_name(argument)


# -- the catalog -------------------------------------------------------------------------------
def test_the_catalog_tells_complete_running_interrupted_empty_and_damaged_apart(
        tmp_path: Path) -> None:
    """A record makes a backup complete; without one, a held lock is a running backup, a
    directory with files and no lock an interrupted one, an empty one may be starting (left
    alone); a record that cannot be read is damaged."""
    backups = tmp_path / BACKUPS
    for name in ("complete", "running", "interrupted", "empty", "damaged"):
        (backups / name).mkdir(parents=True)
    (backups / "complete" / RECORD_NAME).write_bytes(record_to_json(record("complete", 5, 6)))
    (backups / "complete" / "base.tar.zst").write_bytes(b"x" * 10)
    (backups / "complete" / "backup_manifest").write_text("{}")
    (backups / "damaged" / RECORD_NAME).write_text("{")
    for name in ("running", "interrupted"):
        (backups / name / ".base.tar.zst.1.receivewal-tmp").write_bytes(b"x")
    lock = lock_directory(backups / "running")
    try:
        states = {e.backup_id: e.state for e in read_catalog(tmp_path)}
    finally:
        os.close(lock)
    assert states == {"complete": EntryState.COMPLETE, "running": EntryState.RUNNING,
                      "interrupted": EntryState.INTERRUPTED, "empty": EntryState.EMPTY,
                      "damaged": EntryState.DAMAGED}
    assert [e.state for e in read_catalog(tmp_path / "none")] == []


# -- the archive's summary (status, metrics) -----------------------------------------------------
def test_the_oldest_recoverable_point_is_the_oldest_backup_whose_wal_is_all_there(
        tmp_path: Path) -> None:
    """Backups at segments 2-3 (its segment 3 missing), 5-6 and 8: the oldest recoverable
    point is the second's start; sizes count WAL files (a .partial and history too) and every
    file under backups/, an interrupted backup's as well."""
    from receivewal.retention.summary import summarize  # noqa: PLC0415

    for rec in (record("a", 2, 3), record("b", 5, 6), record("c", 8, 8)):
        (tmp_path / BACKUPS / rec.backup_id).mkdir(parents=True)
        (tmp_path / BACKUPS / rec.backup_id / RECORD_NAME).write_bytes(record_to_json(rec))
        (tmp_path / BACKUPS / rec.backup_id / "base.tar.zst").write_bytes(b"x" * 10)
        (tmp_path / BACKUPS / rec.backup_id / "backup_manifest").write_bytes(b"m" * 990)
    (tmp_path / BACKUPS / "interrupted").mkdir()
    (tmp_path / BACKUPS / "interrupted" / "base.tar").write_bytes(b"y" * 500)
    for name in (seg(1, 2), seg(1, 4), seg(1, 5), seg(1, 6, ".zst"), seg(1, 8, ".partial"),
                 history_file_name(2)):
        (tmp_path / name).write_bytes(b"w" * 100)
    (tmp_path / ".receivewal-state.json").write_text("{}")
    summary = summarize(tmp_path)
    assert summary.oldest is not None
    assert summary.oldest.backup_id == "b"
    assert summary.oldest_lsn == summary.oldest.start_lsn == 5 * SEG + 40
    assert (summary.wal_files, summary.wal_bytes, summary.backups) == (6, 600, 3)
    records = sum((tmp_path / BACKUPS / n / RECORD_NAME).stat().st_size for n in "abc")
    assert summary.backup_bytes == 3 * 1000 + 500 + records
    (tmp_path / seg(1, 5)).unlink()
    assert summarize(tmp_path).oldest is None  # c's segment 8 is only a .partial
