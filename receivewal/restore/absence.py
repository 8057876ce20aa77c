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

from receivewal.archive.location import IDENTITY_FILE
from receivewal.wal.leannames import (
    AT_REST_SUFFIXES,
    is_fingerprint,
    is_history_name,
    is_segment_name,
    sealed_suffix,
)

#: The most of the identity record read for the fingerprints of its recipient sets.
_RECORD_CAP = 64 * 1024


def surely_absent(directory: str, name: str) -> bool:
    """Whether the local archive ``directory`` (an existing directory) has no form of the
    segment or history file ``name`` (sealed ones included, to every set the identity record
    lists and in the older form); False whenever that is not plainly so."""
    if not os.path.isdir(directory):
        return False
    if is_segment_name(name):
        fingerprints = listed_fingerprints(directory)
        if fingerprints is None:
            return False
        forms = [name + suffix + sealed for suffix in AT_REST_SUFFIXES
                 for sealed in ("", *(sealed_suffix(f) for f in (*fingerprints, "")))]
    elif is_history_name(name):
        forms = [name]
    else:
        return False
    return not any(os.path.lexists(os.path.join(directory, form)) for form in forms)


def listed_fingerprints(directory: str) -> list[str] | None:
    """Every string of the identity record of ``directory`` shaped like a recipient set's
    fingerprint (16 lower-case hex digits in quotes): the sets' fingerprints, and perhaps a
    few more, which only cost a look each; [] without a record. None when the record cannot
    be read plainly (unreadable, too large, escapes): the full path decides then. Read
    without ``json``, which a lean call does not load."""
    try:
        with open(os.path.join(directory, IDENTITY_FILE), "rb") as record:
            data = record.read(_RECORD_CAP + 1)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    if len(data) > _RECORD_CAP or b"\\" in data:
        return None
    parts = data.split(b'"')
    return [text for text in (part.decode("latin-1") for part in parts[1::2])
            if is_fingerprint(text)]

