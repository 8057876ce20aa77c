"""Telling cheaply that a local archive does not have a file: how a restore_command call ends
recovery (exit 1) without importing the restore machinery (for a segment, once a listing of
the directory has shown no later WAL of its timeline: else a hole, exit 126; see
:func:`receivewal.restore.call.run`).

PostgreSQL asks for files an archive lacks on every recovery: the next timeline's history file
at the start, the segment after the last one at the end (and a standby, every few seconds).
Only the plain case is answered here: a segment or history file name none of whose forms
exists in an existing directory. Anything else (a form exists, even as a dangling symlink, a
``--partial`` call, another kind of name, no directory) goes the full way
(:func:`receivewal.restore.local.restore_file`), which makes the same decision with every check.
"""

from __future__ import annotations

import os

from receivewal.wal.leannames import (
    AT_REST_SUFFIXES,
    ENCRYPTED_SUFFIX,
    is_history_name,
    is_segment_name,
)


def surely_absent(directory: str, name: str) -> bool:
    """Whether the local archive ``directory`` (an existing directory) has no form of the
    segment or history file ``name`` (sealed ones included); False whenever that is not
    plainly so."""
    if is_segment_name(name):
        forms = [name + suffix + sealed for suffix in AT_REST_SUFFIXES
                 for sealed in ("", ENCRYPTED_SUFFIX)]
    elif is_history_name(name):
        forms = [name]
    else:
        return False
    if not os.path.isdir(directory):
        return False
    return not any(os.path.lexists(os.path.join(directory, form)) for form in forms)

