"""Retention and the summary: what ``receivewal cleanup`` removes from an archive, and what
an archive holds in a few numbers (``status``, ``backups``, the daemon's meter).

    plan           what cleanup removes and keeps, and why, following timeline history (pure)
    policy         --keep-backups / --recovery-window from the command line or environment (pure)
    archivecleanup cleanup -D DIR OLDESTKEPTWALFILE, pg_archivecleanup's rule (pure)
    removal        the archive read for the planner, and the removal (files, objects)
    summary        an archive's size, its backups and its oldest recoverable point (files)

It reads the backups through :mod:`receivewal.backup` (their records and catalog) and the
archive through its view; every fsync and rename goes through
:mod:`receivewal.archive.durable`.
"""
