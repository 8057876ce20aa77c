"""Restore: ``receivewal restore %f %p``, PostgreSQL's restore_command, and its prefetch spool.

A call (:mod:`~receivewal.restore.call`: ``run(Call)`` returns the exit status) restores one
file from a local archive (:mod:`~receivewal.restore.local`) or a bucket
(:mod:`~receivewal.restore.remote`), writing it to ``%p`` checked
(:mod:`~receivewal.restore.writing`); or answers at once that a local archive lacks it
(:mod:`~receivewal.restore.absence`); or takes it from the prefetch spool
(:mod:`~receivewal.restore.served`), which a detached filler keeps ahead of recovery
(:mod:`~receivewal.restore.launch` starts it, :mod:`~receivewal.restore.filler` is what it does;
:mod:`~receivewal.restore.spoolfiles`, the spool on disk that both sides read).

What a call may import: the start-up-cost rule, stated here once and held by
tests/test_restore_lean.py. PostgreSQL runs restore_command once per WAL file and waits for
each, so a call's start-up is recovery's time:

1. No call imports a module of :data:`NEVER` (click, structlog, psycopg); boto3 only when it
   restores from a bucket itself, a codec only for a file compressed with it.
2. A call served from the prefetch spool, and one answered at once that a local archive lacks
   its file, loads nothing beyond the interpreter's start but receivewal's modules of
   :data:`LEAN` and the standard library's of :data:`OS_LEVEL`: no ``dataclasses``,
   ``pathlib``, ``re``, ``typing``, ``enum`` or ``json``, each of which costs a call more CPU
   than the rename it makes.
3. So a module of :data:`LEAN` imports at its top only modules of :data:`LEAN` and
   :data:`OS_LEVEL`; whatever else it needs (restoring from the archive, starting a filler) it
   imports inside the function that needs it.
"""

#: Never imported by a restore call.
NEVER = frozenset({"click", "structlog", "psycopg"})

#: receivewal's modules on a call's lean path, from the console script's entry point on.
LEAN = frozenset({
    "receivewal", "receivewal.errors",
    "receivewal.commands", "receivewal.commands.cli", "receivewal.commands.restore_options",
    "receivewal.commands.plain", "receivewal.commands.catalog", "receivewal.secrets",
    "receivewal.commands.configfile",  # read first when RECEIVEWAL_CONFIG names a file
    "receivewal.restore", "receivewal.restore.call", "receivewal.restore.served",
    "receivewal.restore.spoolfiles", "receivewal.restore.absence",
    "receivewal.archive", "receivewal.archive.durable", "receivewal.archive.location",
    "receivewal.wal", "receivewal.wal.lsn", "receivewal.wal.pageheader", "receivewal.wal.majors",
    "receivewal.wal.leannames",
})

#: The standard library's modules a lean call may load: the operating system's calls.
OS_LEVEL = frozenset({"__future__", "os", "sys", "time", "stat", "errno", "fcntl", "zlib",
                      "struct", "_struct", "contextlib"})
