"""``cleanup -D DIR OLDESTKEPTWALFILE``: pg_archivecleanup's rule, for
``archive_cleanup_command = 'receivewal cleanup -D DIR %r'`` (pure).

As pg_archivecleanup does, the argument may be a WAL file name, the same with ``.partial``, or
a backup history file name (``...XXXXXXXX.backup``: its first 24 characters count); receivewal
also takes a compression suffix. Every segment file whose name, without the timeline (the
characters after the first eight), sorts before the argument's is removed, whatever its
timeline, compression and sealing (a sealed segment ``F.FINGERPRINT.age`` is judged as ``F``,
and so are ``F.age`` and its ``F.age.recipients`` of the older form); with ``-x EXT``, a name
that ends with ``EXT`` too, judged without it.
Unlike pg_archivecleanup, a ``.partial`` is never removed (in a
receivewal archive it is the segment the daemon is writing), and neither is a history file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from receivewal.errors import ConfigurationError
from receivewal.retention.plan import Verdict
from receivewal.wal.names import (
    PARTIAL_SUFFIX,
    RECIPIENTS_SUFFIX,
    is_wal_file_name,
    looks_like_segment,
    unsealed_name,
)

_BACKUP_HISTORY = re.compile(r"([0-9A-F]{24})\.[0-9A-F]{8}\.backup")


def oldest_kept_name(argument: str) -> str:
    """The WAL file name the argument stands for; ConfigurationError as pg_archivecleanup's
    "invalid file name argument"."""
    match = _BACKUP_HISTORY.fullmatch(argument)
    if match is not None:
        return match.group(1)
    if looks_like_segment(argument) and is_wal_file_name(argument[:24]):
        return argument[:24]
    raise ConfigurationError(f'invalid file name argument "{argument}": give a WAL file name '
                             "(as %r is), a .partial or a backup history file name")


def plan_archive_cleanup(files: Sequence[str], argument: str, extension: str = ""
                         ) -> list[Verdict]:
    """The verdict on each segment file of ``files`` (other names are not WAL: not judged);
    a name ending with ``extension`` (pg_archivecleanup's ``-x``) is judged without it."""
    if extension and argument.endswith(extension):
        argument = argument[:-len(extension)]
    oldest = oldest_kept_name(argument)
    verdicts = []
    for name in sorted(files):
        judged = name[:-len(extension)] if extension and name.endswith(extension) else name
        judged = unsealed_name(judged.removesuffix(RECIPIENTS_SUFFIX))
        if not looks_like_segment(judged):
            continue
        if judged.endswith(PARTIAL_SUFFIX):
            verdicts.append(Verdict(name, False, "a .partial is never removed"))
        elif judged[8:24] < oldest[8:24]:
            verdicts.append(Verdict(name, True, f"before {oldest}"))
        else:
            verdicts.append(Verdict(name, False, f"not before {oldest}"))
    return verdicts
