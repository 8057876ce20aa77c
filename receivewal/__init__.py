"""receivewal: a crash-safe physical WAL archiver for PostgreSQL that speaks pg_streampack.

The subpackages follow the path of a WAL byte, top to bottom; a layer imports only the layers
below it (docs/architecture.md has the module map):

    commands/     the command line: options declared once, parsed (click, or by hand on the
                  lean restore and verify paths and in the pg_receivewal drop-in), handed over
    walreceiver/  the WAL archive's receiver (receiver) and its sessions (session: startpoint,
                  then the daemon's COPY loop driving archivefeed), the uploader, the meter
    logicalreceiver/  a logical slot's receiver (receiver), its session and its consumer
                  (changefeed), writing the change log of logical/
    daemon/       what both receivers share: the supervisor (signals, reconnects, exit codes)
                  running a receiver and its sessions, the COPY loop (copyloop) driving a
                  consumer, one event stream (events, lifecycle) and what it tells the
                  outside (monitor, state file, metrics, systemd)
    replication/  libpq connection (non-blocking; waiting on socket + stop signal), replication
                  commands, the COPY stream (copystream: runs of XLogData, keepalives, the
                  end), CopyData codecs, pg_streampack codec and its negotiation
    archive/      segment files on disk and in a bucket: layout, writers, compression at rest,
                  durability (the one home of fsync and rename), uploads
    wal/          LSNs, file names, timelines, the WAL page and record reader (pure)

Beside that path, each over the layers it reads:

    check/        reads archives back (verify, analyze)
    restore/      serves the archive to PostgreSQL's recovery: restore_command's helper and
                  its prefetch spool
    backup/       base backups over the replication protocol: taken, stored, read back
    retention/    cleanup: what a retention policy removes; an archive's summary (size, backups)
    recovery/     recover: a backup unpacked into a data directory that recovers from the archive
    logical/      logical change streams kept as a change log (decode, assemble, write): another
                  consumer of the daemon's COPY loop
    relay/        compresses a plain server's stream for receivers over a slow link
"""

__version__ = "0.1.0"
