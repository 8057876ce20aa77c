"""Base backups: taken over the replication protocol into the archive, stored, read back
(recovery is :mod:`receivewal.recovery`'s, retention :mod:`receivewal.retention`'s).

The flow of ``receivewal backup``, top to bottom:

    command        PostgreSQL 15's BASE_BACKUP command text and its result sets (pure)
    backupstream   the COPY stream's messages: new archive, data, progress, manifest (pure)
    tar            a streaming tar reader: members and their data in pieces (pure)
    manifest       backup_manifest, its own checksum, the check of the files against it (pure)
    receipt        the stream fed in, every file hashed, compared with the manifest (pure)
    transfer       BASE_BACKUP over a link, into a backup directory
    backupdir      ARCHIVE/backups/<id>/: archives, manifest, the record last (files)
    record         backup.json, the record of a complete backup (pure)
    catalog        the backups an archive holds: complete, running, interrupted (files)
    stored         a stored backup read back, every file checked against its manifest (files)
    sealing        a tar's and the manifest's stored form (--encrypt-to), read back too
    upload         a backup streamed into a bucket, record last (objects)
    taking         ``receivewal backup`` end to end: identity, transfer, the wait for its WAL

Every fsync and rename goes through :mod:`receivewal.archive.durable`; the connection is
reached through :class:`~receivewal.backup.transfer.BackupLink` (no psycopg here).
"""
