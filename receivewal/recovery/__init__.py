"""Recovery: ``receivewal recover``, from a base backup in the archive to a data directory
that PostgreSQL recovers from.

    choice         which backup a recovery to a target starts from (pure)
    reach          how far a recovery replays: the last commit or abort it reaches (files)
    recoveryconf   the recovery settings as text; how to start the server (pure)
    owner          recover --owner: whose the files are, checked before anything is written
    unpack         a backup into an empty data directory, and the recovery files (files)
    recovering     ``receivewal recover`` end to end: choice, unpack, recovery settings

It reads the backups through :mod:`receivewal.backup` (their records, catalog and stored
files) and the archive through its view; every fsync and rename goes through
:mod:`receivewal.archive.durable`.
"""
