"""The local copy's rule applied by the daemon (``stream --upload-to URL --keep-local 24h``).

:class:`LocalCopy` is a thread of the WAL receiver's (a
:class:`~receivewal.daemon.worker.Worker`): it applies the rule of
:mod:`receivewal.retention.localrule` to the archive directory after the uploader confirms an
upload (it follows :class:`~receivewal.daemon.lifecycle.UploadsChanged` on the event stream)
and every :data:`INTERVAL` seconds (an age window moves with the clock), never on the thread
that receives WAL. What is uploaded is what the uploader recorded once the store confirmed it
(the upload record in the directory), read again at each application; the slot's restart
position and the timeline are the state file's, as ``cleanup`` reads them. Each application
is stated as :class:`~receivewal.daemon.lifecycle.LocalCopyChanged` (the state file,
``status``, the metrics); a removal is logged (``local_files_removed``), a failure too
(``local_rule_failed``): the next application tries again, streaming goes on.

For the tests: ``RECEIVEWAL_TEST_LOCAL_INTERVAL`` sets the seconds between two applications.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from receivewal.archive.keeplocal import INTERVAL, INTERVAL_ENV, KeepLocal
from receivewal.daemon.events import Event, EventStream
from receivewal.daemon.lifecycle import LocalCopyChanged, UploadsChanged
from receivewal.daemon.state import LocalCopyStatus, read_state
from receivewal.daemon.worker import Worker
from receivewal.errors import ReceivewalError
from receivewal.retention.localrule import LocalReport, apply_local_rule
from receivewal.retention.removal import Holds


class LocalCopy(Worker):
    """Applies ``rule`` to the archive ``directory`` that uploads to ``destination``."""

    def __init__(self, directory: Path, destination: str, rule: KeepLocal, events: EventStream,
                 log: FilteringBoundLogger, *, sync: bool = True,
                 environ: Mapping[str, str], clock: Callable[[], float] = time.time) -> None:
        super().__init__("local-copy", events, clock=clock)
        self.directory = directory
        self.destination = destination
        self.rule = rule
        self.log = log
        self.sync = sync
        self.interval = float(environ.get(INTERVAL_ENV, INTERVAL))
        self._status = LocalCopyStatus(rule.describe())
        self._uploaded = -1  # the uploader's count of files uploaded, as last seen

    def start(self) -> None:
        """Follow the uploads and apply the rule now, then after each upload confirmed."""
        self.events.post(LocalCopyChanged(self._status))
        self.follow_events()
        self.start_thread()

    def follow(self, event: Event) -> None:
        """An upload confirmed: the rule is due (never blocks)."""
        if isinstance(event, UploadsChanged) and event.status.uploaded_files != self._uploaded:
            self._uploaded = event.status.uploaded_files
            self.due()

    def run(self) -> None:
        while self.await_due(self.interval):
            self.apply()

    def apply(self) -> LocalCopyStatus:
        """Apply the rule once; the status stated."""
        try:
            report = apply_local_rule(self.directory, self.rule, self._holds(), self.clock(),
                                      sync=self.sync)
        except ReceivewalError as exc:
            self._status = replace(self._status, last_error=self.failure(exc))
            self.log.warning("local_rule_failed", error=str(exc), kind=type(exc).__name__)
        else:
            self._status = self._applied(report)
        self.events.post(LocalCopyChanged(self._status))
        return self._status

    def _holds(self) -> Holds:
        """What the daemon holds on to, as its state file says (what ``cleanup`` reads)."""
        state = read_state(self.directory)
        if state is None:
            return Holds(upload_to=self.destination)
        return Holds(state.slot_restart_lsn if state.slot is not None else None,
                     state.timeline, self.destination)

    def _applied(self, report: LocalReport) -> LocalCopyStatus:
        plan, status = report.plan, self._status
        status = replace(status, held_files=plan.held_files, held_bytes=plan.held_bytes,
                         window_files=plan.window_files, last_error=None)
        if not report.removed:
            return status
        first, last = report.removed[0], report.removed[-1]
        words = f"{first} .. {last}" if first != last else first
        self.log.info("local_files_removed", files=len(report.removed), first=first, last=last,
                      bytes=report.removed_bytes, rule=self.rule.text)
        return replace(status, removed_files=status.removed_files + len(report.removed),
                       removed_bytes=status.removed_bytes + report.removed_bytes,
                       last_removed=f"{words} ({len(report.removed)} files, "
                                    f"{report.removed_bytes} bytes)",
                       last_removed_at=self.clock())
