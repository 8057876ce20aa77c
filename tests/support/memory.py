"""Measuring a child process's memory (and its CPU time, for the benchmarks)."""

from __future__ import annotations

import os

#: Python source that evaluates to the running process's own peak RSS in kB, for a child to
#: print. Not ru_maxrss: Linux carries the high-water mark of the address space that execve
#: replaced (the forked copy of the pytest process) into it, so in a long test session it
#: reports pytest's own size. VmHWM belongs to the new address space.
PEAK_RSS_KB = ("next(int(line.split()[1]) for line in open('/proc/self/status') "
               "if line.startswith('VmHWM:'))")


def peak_rss_kb(pid: int) -> int:
    """The peak resident memory (VmHWM) of the running process ``pid``, in kB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the running process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
