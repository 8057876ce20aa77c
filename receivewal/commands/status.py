"""``receivewal status -D DIR``: read the state file and say whether the daemon is healthy.

Works as a Nagios-style check: the first line is a one-line summary and the exit code is

- 0 OK: the daemon runs and heard from the server within ``--max-age`` seconds;
- 1 WARNING: as OK, but the archive holds an island of older segments before a hole, or
  uploads (``stream --upload-to``) lag past ``--upload-warning`` or just failed;
- 2 CRITICAL: the daemon is not running (no process holds the archive's lock, or it recorded
  a stop), or it has had no contact with the server for longer than ``--max-age`` seconds, or
  uploads lag past ``--upload-critical`` or are refused;
- 3 UNKNOWN: there is no state file, or it cannot be read or trusted (not a regular file,
  too large, a value out of range).

When whoever reads the output leaves early (``status | head -1``) the command stops writing
quietly and still exits with its verdict. :mod:`receivewal.daemon.health` judges the state;
this module is the command only.

When the daemon uploads (``stream --upload-to``, recorded in its state file) the bucket's
backups count too: the oldest recoverable point is the older of the directory's and the
bucket's (:func:`~receivewal.retention.summary.summarize_view`, as ``receivewal backups`` reads
them), and a line says what the bucket holds. A bucket that cannot be read is said so, and
changes no verdict.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from receivewal.archive.view import ArchiveView
from receivewal.backup.record import BackupRecord, utc_text
from receivewal.check.sizes import human_bytes
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.output import silence_stdout
from receivewal.daemon.health import (
    LABELS,
    UPLOAD_CRITICAL,
    UPLOAD_WARNING,
    UploadLimits,
    Verdict,
    check,
    describe,
)
from receivewal.daemon.state import State, state_to_dict
from receivewal.errors import ReceivewalError
from receivewal.logical.store import ChangeLogContents, change_log_contents
from receivewal.retention.summary import ArchiveSummary, summarize, summarize_view
from receivewal.secrets import redacted
from receivewal.wal.lsn import format_lsn

Contents = ArchiveSummary | ChangeLogContents | str  # str: why it cannot be read


@click.command("status")
@click_option(
    catalog.DIRECTORY.but(
        required=True, metavar="",
        help="The archive directory the daemon streams into (env "
        f"{catalog.DIRECTORY.env})."),
    type=click.Path(file_okay=False, path_type=Path))
@click_option(catalog.JSON.but(help="Print the state as JSON."))
@click.option(
    "--max-age", type=click.FloatRange(min=0), default=60.0, show_default=True,
    help="CRITICAL when the server has not been heard from for longer (seconds).",
)
@click.option(
    "--upload-warning", type=click.FloatRange(min=0), default=UPLOAD_WARNING,
    show_default=True,
    help="With --upload-to: WARNING when the oldest file waiting for upload was completed "
    "longer ago (seconds), or the last try failed.",
)
@click.option(
    "--upload-critical", type=click.FloatRange(min=0), default=UPLOAD_CRITICAL,
    show_default=True,
    help="With --upload-to: CRITICAL when the oldest file waiting for upload was completed "
    "longer ago (seconds); also CRITICAL at once when uploads are refused.",
)
def status_command(directory: Path, as_json: bool, max_age: float, upload_warning: float,
                   upload_critical: float) -> None:
    """Report the daemon's state; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
    (Nagios-style)."""
    now = time.time()
    verdict, state = check(directory, max_age, now, UploadLimits(upload_warning,
                                                                 upload_critical))
    try:
        summary: Contents = (change_log_contents(directory)
                             if state is not None and state.receiver == "logical"
                             else summarize(directory))
    except (ReceivewalError, OSError) as exc:
        summary = f"cannot be read: {exc}"
    bucket = _bucket_summary(state)
    try:
        _print(verdict, state, now, summary, bucket, as_json=as_json)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left early (``status | head -1``): stop writing quietly, as a CLI tool
        # dying of SIGPIPE does, and keep the verdict's exit code.
        silence_stdout()
    raise click.exceptions.Exit(verdict.code)


def _bucket_summary(state: State | None) -> ArchiveSummary | str | None:
    """What the bucket the daemon uploads to holds; None when it uploads nowhere (or is a
    change log's); a str saying why it cannot be read."""
    if state is None or not state.upload_to or state.receiver == "logical":
        return None
    try:
        return summarize_view(ArchiveView.open(state.upload_to))
    except (ReceivewalError, OSError) as exc:
        return f"cannot be read: {exc}"


def _print(verdict: Verdict, state: State | None, now: float,
           summary: Contents, bucket: ArchiveSummary | str | None, *, as_json: bool) -> None:
    if as_json:
        contents = ({"change_log": _change_log_document(summary)}
                    if isinstance(summary, ChangeLogContents) else
                    {"archive": _archive_document(summary)})
        if bucket is not None:
            contents["bucket"] = _archive_document(bucket)
        document = {
            "status": LABELS[verdict.code],
            "code": verdict.code,
            "summary": verdict.summary,
            "state": None if state is None else state_to_dict(state),
            **contents,
        }
        click.echo(redacted(json.dumps(document, indent=2)))
    else:
        click.echo(redacted(verdict.summary))
        if state is not None:
            click.echo("")
            for line in describe(state, now, _archive_lines(summary, bucket)):
                click.echo(redacted(line))


def _archive_lines(summary: Contents,
                   bucket: ArchiveSummary | str | None = None) -> list[tuple[str, str]]:
    """The archive's oldest recoverable point and size (the bucket's backups too, when the
    daemon uploads), or the change log's files, as ``status`` prints them."""
    if isinstance(summary, str):
        return [("archive contents", summary)]
    if isinstance(summary, ChangeLogContents):
        partial = "none" if summary.partial is None else \
            f"{summary.partial} ({human_bytes(summary.partial_bytes)})"
        files = "file" if summary.files == 1 else "files"
        return [("change log", f"{summary.files} complete {files} "
                 f"{human_bytes(summary.bytes)} (newest {summary.newest or '-'}), "
                 f"partial {partial}")]
    oldest, where = summary.oldest, ""
    if isinstance(bucket, ArchiveSummary) and bucket.oldest is not None and (
            oldest is None or bucket.oldest.start_lsn < oldest.start_lsn):
        oldest, where = bucket.oldest, ", in the bucket"
    point = "none (no complete backup whose WAL the archive holds)" if oldest is None else \
        _point(oldest, where)
    total = summary.wal_bytes + summary.backup_bytes
    lines = [("oldest recoverable", point),
             ("archive size", f"{human_bytes(total)}: {summary.wal_files} WAL files "
              f"{human_bytes(summary.wal_bytes)}, {summary.backups} backups "
              f"{human_bytes(summary.backup_bytes)}")]
    if summary.interrupted:
        ids = ", ".join(backup_id for backup_id, _ in summary.interrupted)
        lines.append(("interrupted backups",
                      f"{len(summary.interrupted)}, {human_bytes(summary.interrupted_bytes)}: "
                      f"{ids} (no record: no recovery starts from them; receivewal cleanup "
                      "removes them)"))
    if isinstance(bucket, str):
        lines.append(("bucket", bucket))
    elif bucket is not None:
        lines.append(("bucket", f"{bucket.backups} backups {human_bytes(bucket.backup_bytes)}, "
                      f"{bucket.wal_files} WAL files {human_bytes(bucket.wal_bytes)}; oldest "
                      "recoverable: " + ("none" if bucket.oldest is None else
                                         _point(bucket.oldest, ""))))
    return lines


def _point(oldest: BackupRecord, where: str) -> str:
    """A recoverable point as ``status`` prints it."""
    return (f"{format_lsn(oldest.start_lsn)} on timeline {oldest.timeline}, "
            f"{utc_text(oldest.start_time)} (backup {oldest.backup_id}{where})")


def _change_log_document(summary: ChangeLogContents) -> dict[str, object]:
    """The change log's files for ``--json``."""
    return {"files": summary.files, "bytes": summary.bytes, "newest": summary.newest,
            "partial": summary.partial, "partial_bytes": summary.partial_bytes}


def _archive_document(summary: ArchiveSummary | str) -> dict[str, object]:
    """The same for ``--json``."""
    if isinstance(summary, str):
        return {"error": summary}
    oldest = summary.oldest
    return {
        "wal_files": summary.wal_files, "wal_bytes": summary.wal_bytes,
        "backups": summary.backups, "backup_bytes": summary.backup_bytes,
        "interrupted_backups": [{"backup_id": backup_id, "bytes": size}
                                for backup_id, size in summary.interrupted],
        "interrupted_bytes": summary.interrupted_bytes,
        "oldest_recoverable": None if oldest is None else {
            "backup_id": oldest.backup_id, "lsn": format_lsn(oldest.start_lsn),
            "timeline": oldest.timeline, "time": utc_text(oldest.start_time)},
    }
