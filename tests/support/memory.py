"""Measuring a child process's memory."""

from __future__ import annotations

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
