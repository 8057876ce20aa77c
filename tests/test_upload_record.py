"""The upload spool without a store: the local record of what is uploaded, the backlog it
leaves, how ``status`` judges the uploads, and the options' rules."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from receivewal.archive.directory import Archive
from receivewal.archive.uploads import (
    UPLOADED_FILE,
    UploadRecord,
    pending_files,
    read_upload_record,
    write_upload_record,
)
from receivewal.commands.cli import cli
from receivewal.daemon.health import CRITICAL, OK, WARNING, UploadLimits, evaluate
from receivewal.daemon.metrics import Metrics
from receivewal.daemon.state import LastError, State, UploadStatus, decode_state, encode_state
from receivewal.errors import ArchiveError
from receivewal.walreceiver.uploader import confirmable_flush

SEGMENT = 16 * 1024 * 1024
URL = "s3://bucket/wal"


def archive_with(tmp_path: Path, *names: str) -> Archive:
    for name in names:
        (tmp_path / name).write_bytes(name.encode())
    return Archive(tmp_path)


def test_the_backlog_is_every_completed_file_the_record_does_not_cover_in_order(
        tmp_path: Path) -> None:
    """Completed segments (any at-rest format) and history files are pending, .partial files
    and other files are not; each timeline's history file goes before its segments."""
    archive = archive_with(tmp_path, "000000010000000000000001", "000000010000000000000002.zst",
                           "000000020000000000000003", "00000002.history",
                           "000000020000000000000004.partial", ".receivewal-state.json",
                           "000000010000000000000003.partial")
    names = [p.name for p in pending_files(archive, UploadRecord(URL), SEGMENT)]
    assert names == ["000000010000000000000001", "000000010000000000000002.zst",
                     "00000002.history", "000000020000000000000003"]
    record = UploadRecord(URL).with_uploaded("000000010000000000000001", SEGMENT) \
        .with_uploaded("00000002.history", SEGMENT)
    names = [p.name for p in pending_files(archive, record, SEGMENT)]
    assert names == ["000000010000000000000002.zst", "000000020000000000000003"]


def test_the_record_survives_a_restart_and_belongs_to_one_destination(tmp_path: Path) -> None:
    """Written durably and read back; a record about another URL covers nothing there."""
    archive = archive_with(tmp_path, "000000010000000000000001", "000000010000000000000002")
    record = UploadRecord(URL).with_uploaded("000000010000000000000001", SEGMENT)
    write_upload_record(archive, record)
    assert read_upload_record(archive, URL) == record
    assert read_upload_record(archive, "s3://bucket/elsewhere") == \
        UploadRecord("s3://bucket/elsewhere")
    assert [p.name for p in pending_files(archive, read_upload_record(archive, URL),
                                          SEGMENT)] == ["000000010000000000000002"]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".receivewal-tmp")]


def test_an_older_segment_never_moves_the_record_back() -> None:
    """Segments are confirmed in order: the record keeps the furthest one."""
    record = UploadRecord(URL).with_uploaded("000000010000000000000005", SEGMENT)
    assert record.with_uploaded("000000010000000000000003", SEGMENT) == record
    assert record.covers("000000010000000000000004.gz", SEGMENT)
    assert not record.covers("000000010000000000000006", SEGMENT)


def test_a_damaged_record_is_an_archive_error_naming_it(tmp_path: Path) -> None:
    """Never read as "nothing uploaded" nor as "everything uploaded": the daemon says so."""
    (tmp_path / UPLOADED_FILE).write_text('{"version": 1, "segment": 7, "history": []}')
    with pytest.raises(ArchiveError, match=UPLOADED_FILE):
        read_upload_record(Archive(tmp_path), URL)


def uploading(**changes: object) -> State:
    base = State(pid=1, hostname="h", started_at=0.0, updated_at=1000.0, phase="streaming",
                 timeline=1, received_lsn=0x5000000, flushed_lsn=0x5000000,
                 last_contact=999.0, upload_to=URL)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_status_judges_the_uploads_like_its_other_checks() -> None:
    """OK while uploads keep up; WARNING when the store just failed or the backlog ages past
    the warning; CRITICAL past the critical age or when uploads are refused."""
    limits = UploadLimits(warning=300, critical=600)
    assert evaluate(uploading(), 1000.0, 60, True, limits).code == OK
    down = LastError("StoreError", "s3://bucket/wal/X at http://s3: connection refused", 990.0)
    verdict = evaluate(uploading(upload_error=down, upload_failing_since=990.0,
                                 upload_pending_files=1, upload_oldest_pending=980.0),
                       1000.0, 60, True, limits)
    assert verdict.code == WARNING
    assert "connection refused" in verdict.summary
    assert evaluate(uploading(upload_pending_files=3, upload_oldest_pending=600.0), 1000.0, 60,
                    True, limits).code == WARNING
    old = evaluate(uploading(upload_pending_files=3, upload_pending_bytes=3 * SEGMENT,
                             upload_oldest_pending=0.0), 1000.0, 60, True, limits)
    assert old.code == CRITICAL
    assert "upload backlog 3 files (48.0 MB)" in old.summary
    denied = LastError("StoreAccessDenied", "access denied (SignatureDoesNotMatch)", 999.0)
    verdict = evaluate(uploading(upload_error=denied, upload_failing_since=999.0), 1000.0, 60,
                       True, limits)
    assert verdict.code == CRITICAL
    assert "SignatureDoesNotMatch" in verdict.summary
    # an error that is over (a later try succeeded) is shown, not judged
    assert evaluate(uploading(upload_error=denied), 1000.0, 60, True, limits).code == OK


def test_the_upload_fields_round_trip_through_the_state_file() -> None:
    """Backlog, times and the last upload error are written and read back as they were."""
    state = uploading(upload_pending_files=2, upload_pending_bytes=10, upload_oldest_pending=5.0,
                      uploaded_files=7, last_uploaded="000000010000000000000004",
                      upload_error=LastError("ObjectConflict", "a different object", 6.0),
                      upload_failing_since=6.0)
    assert decode_state(encode_state(state)) == state


@pytest.mark.parametrize(("args", "message"), [
    (["--confirm-after", "upload"], "--confirm-after upload needs --upload-to"),
    (["--upload-to", "s3://Bad_Bucket/wal"], "not a valid bucket name"),
    (["--upload-to", "/var/lib/wal"], "not an s3:// URL"),
])
def test_upload_options_are_checked_before_connecting(tmp_path: Path, args: list[str],
                                                      message: str) -> None:
    """A wrong --upload-to or --confirm-after is a usage error (exit 2), nothing is started."""
    result = CliRunner().invoke(cli, ["stream", "-D", str(tmp_path), "-d", "host=nowhere",
                                      *args])
    assert result.exit_code == 2
    assert message in result.output


def test_the_metrics_show_the_backlog_and_the_last_upload_error() -> None:
    """Backlog files, bytes and age, uploads since start, failing, and the last error's kind."""
    metrics = Metrics(clock=lambda: 1000.0)
    metrics.set_uploads(UploadStatus(URL, pending_files=2, pending_bytes=2 * SEGMENT,
                                     oldest_pending=970.0, uploaded_files=5,
                                     last_error=LastError("StoreAccessDenied", "denied", 990.0),
                                     failing_since=990.0))
    samples = {(sample.name, tuple(sample.labels.items())): sample.value
               for family in metrics.collect() for sample in family.samples}
    assert samples[("receivewal_upload_pending_files", ())] == 2
    assert samples[("receivewal_upload_pending_bytes", ())] == 2 * SEGMENT
    assert samples[("receivewal_upload_oldest_pending_age_seconds", ())] == 30
    assert samples[("receivewal_uploaded_files_total", ())] == 5
    assert samples[("receivewal_upload_failing", ())] == 1
    assert samples[("receivewal_upload_last_error_timestamp_seconds", ())] == 990
    assert samples[("receivewal_upload_last_error_info", (("kind", "StoreAccessDenied"),))] == 1


def test_confirm_after_upload_reports_no_further_than_the_uploads_and_never_backwards() -> None:
    """The flush reported is capped at the end of the last uploaded segment; before the first
    upload, or while that end lies behind where the stream started, nothing is reported (0),
    so that the slot stays where it was instead of moving back."""
    start = 5 * SEGMENT
    assert confirmable_flush(7 * SEGMENT + 100, None, start) == 0
    assert confirmable_flush(7 * SEGMENT + 100, 2 * SEGMENT, start) == 0  # an old backlog
    assert confirmable_flush(7 * SEGMENT + 100, 6 * SEGMENT, start) == 6 * SEGMENT
    assert confirmable_flush(5 * SEGMENT + 100, 6 * SEGMENT, start) == 5 * SEGMENT + 100


def test_uploads_stopped_at_an_object_stay_critical_naming_it() -> None:
    """Uploads stopped at an object (a different object at its key) are CRITICAL naming it,
    also while a later try of that file fails otherwise (the store down: a WARNING alone), and
    the stop survives the state file; the metrics show it with the object."""
    key = f"{URL}/000000010000000000000004"
    conflict = LastError("ObjectConflict", f"{key}: a different object is already stored",
                         990.0)
    down = LastError("StoreError", f"{key} at http://s3: connect timeout", 999.0)
    state = uploading(upload_error=down, upload_failing_since=990.0, upload_stopped=conflict,
                      upload_pending_files=1, upload_oldest_pending=980.0)
    verdict = evaluate(state, 1000.0, 60, True, UploadLimits())
    assert verdict.code == CRITICAL
    assert key in verdict.summary
    assert decode_state(encode_state(state)) == state
    metrics = Metrics(clock=lambda: 1000.0)
    metrics.set_uploads(UploadStatus(URL, last_error=down, failing_since=990.0,
                                     stopped=conflict, stopped_object=key))
    samples = {(sample.name, tuple(sample.labels.items())): sample.value
               for family in metrics.collect() for sample in family.samples}
    assert samples[("receivewal_upload_stopped", ())] == 1
    assert samples[("receivewal_upload_stopped_object_info",
                    (("kind", "ObjectConflict"), ("object", key)))] == 1
    metrics.set_uploads(UploadStatus(URL))
    samples = {(sample.name, tuple(sample.labels.items())): sample.value
               for family in metrics.collect() for sample in family.samples}
    assert samples[("receivewal_upload_stopped", ())] == 0
