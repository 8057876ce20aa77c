"""What a command prints on standard output, as a well-behaved Unix tool prints it.

A reader that leaves early (``receivewal verify DIR | head -1``) ends the output quietly: no
message, and the command's exit status stays its verdict's, as for a tool whose pipeline's
status is the reader's. A standard output that cannot be written (a full disk,
``> /dev/full``, an I/O error) is one line on stderr and :data:`NOT_A_VERDICT`. Either way what
is still buffered is sent to /dev/null, so that the interpreter's last flush does not fail
again. Click-free: the lean ``verify`` path uses it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

#: The exit status of ``verify`` and ``analyze`` when they give no verdict: the command line
#: is wrong, or the report could not be written. 0 and 1 are verdicts (recoverable, NOT
#: recoverable), as grep and diff keep 0 and 1 for theirs and 2 for trouble.
NOT_A_VERDICT = 2
#: ``verify``'s verdict "unknown": nothing wrong was found in what could be read, but files
#: sealed at rest could not be checked without a key (``--identity``).
VERDICT_UNKNOWN = 3
#: The exit status of each of ``verify``'s verdicts.
VERDICT_STATUS = {"recoverable": 0, "NOT recoverable": 1, "unknown": VERDICT_UNKNOWN}


def deliver(write: Callable[[], None], status: int) -> int:
    """Run ``write`` (which prints the report) and flush standard output; return ``status``,
    or :data:`NOT_A_VERDICT` when standard output cannot be written."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return status
    except OSError as exc:
        silence_stdout()
        sys.stderr.write("receivewal: error: could not write to standard output: "
                         f"{exc.strerror or exc}\n")
        sys.stderr.flush()
        return NOT_A_VERDICT
    return status


def silence_stdout() -> None:
    """Point standard output's descriptor at /dev/null (what is still buffered goes there,
    the interpreter's last flush included)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass
