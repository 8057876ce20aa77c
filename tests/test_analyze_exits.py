"""``receivewal analyze`` passes over nothing in an archive without a word, and ends quietly with
its verdict when the reader of its summary has left (issue 25, left open last round).

The driver's planning and the executors' task (:func:`plan_archive`, :func:`scan_row`) run here
without Spark on a directory holding, under WAL file names, a FIFO, a socket, a directory and
(as root) a character device. The command line ending quietly with its verdict when the reader
of its summary has left (an intact archive whose output pipe nobody reads) runs with a JVM of
its own once in the suite: test_analyze.py's test_cli_on_one_archive_is_quiet_and_leaves_no_scratch.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from types import SimpleNamespace

from support.servers import IS_ROOT
from test_verify_truth import NAMES, write_pair

from receivewal.check.analyze import TASK_SCHEMA, plan_archive, scan_from_json, scan_row
from receivewal.check.crosscheck import check_archive
from receivewal.wal.reader import WalProblem


def segment_after(name: str, steps: int) -> str:
    return f"{name[:16]}{int(name[16:], 16) + steps:08X}"


def odd_archive(directory: Path) -> dict[str, str]:
    """The fixture pair, and under the names of the following segments and of a history file
    things that are not regular files; returns {name: what it is}."""
    write_pair(directory)
    odd = {segment_after(NAMES[1], 1): "a FIFO", segment_after(NAMES[1], 2): "a socket",
           segment_after(NAMES[1], 3): "a directory", "00000002.history": "a directory"}
    os.mkfifo(directory / segment_after(NAMES[1], 1))
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(directory / segment_after(NAMES[1], 2)))
    listener.close()  # the socket file stays
    (directory / segment_after(NAMES[1], 3)).mkdir()
    (directory / "00000002.history").mkdir()
    if IS_ROOT:
        name = segment_after(NAMES[1], 4)
        os.mknod(directory / name, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # as /dev/null
        odd[name] = "a character device"
    return odd


def test_analyze_reports_what_is_not_a_regular_file_under_a_wal_name(tmp_path: Path) -> None:
    """Each odd entry is planned as a task (a history name is read by the driver) and becomes
    an ``unreadable`` problem naming the file and what it is: the archive is NOT recoverable.
    None is read from (the FIFO would block, the device would be opened)."""
    directory = tmp_path / "a"
    odd = odd_archive(directory)
    rows, histories, segment_size, problems, _sysid = plan_archive(None, str(directory), False)
    fields = [column.split()[0] for column in TASK_SCHEMA.split(", ")]
    tasks = [SimpleNamespace(**dict(zip(fields, row, strict=True))) for row in rows]
    assert {t.file for t in tasks} == {*NAMES, *(n for n in odd if n != "00000002.history")}
    assert histories == {}
    scans, unreadable = [], list(problems)
    for task in tasks:
        out = scan_row(task)
        if out["scan_json"] is None:
            unreadable += [WalProblem(**p) for p in out["problems"]]
        else:
            scans.append(scan_from_json(out["scan_json"]))
    report = check_archive(segment_size, scans, histories, extra_problems=unreadable)
    found = {p.file: p.detail for p in report.problems if p.kind == "unreadable"}
    assert found.keys() == odd.keys(), report.problems
    for name, what in odd.items():
        assert f'"{directory / name}" is {what}' in found[name]
    assert not report.recoverable
