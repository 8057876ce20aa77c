"""receivewal: a crash-safe physical WAL archiver for PostgreSQL that speaks pg_streampack.

The subpackages follow the path of a WAL byte, top to bottom, on floors: a room imports only
the rooms on the floors below its own, never one beside it (tests/test_layout.py's FLOORS;
docs/architecture.md has the module map):

    commands/        6  the command line: options declared once, parsed (click, or by hand on the
                        lean restore and verify paths and in the pg_receivewal drop-in), handed over
    walreceiver/     5  the WAL archive's receiver (receiver) and its sessions (session:
                        startpoint, then the daemon's COPY loop driving archivefeed), the uploader,
                        the meter (which reads retention's summary)
    recovery/        5  recover: a backup unpacked into a data directory that recovers from the
                        archive (which backup, how far it reaches, the recovery settings)
    logicalreceiver/ 4  a logical slot's receiver (receiver), its session and its consumer
                        (changefeed), writing the change log of logical/
    retention/       4  cleanup: what a retention policy removes; an archive's summary (size,
                        backups, oldest recoverable point)
    check/           4  reads archives back (verify, analyze; the backups verify checks)
    apply/           4  a change log made tables: its snapshot and transactions applied to a
                        target database, exactly once, in commit order
    daemon/          3  what both receivers share: the supervisor (signals, reconnects, exit codes)
                        running a receiver and its sessions, the COPY loop (copyloop) driving a
                        consumer, one event stream (events, lifecycle) and what it tells the
                        outside (monitor, state file, metrics, systemd)
    backup/          3  base backups over the replication protocol: taken, stored, read back
    logical/         3  logical change streams kept as a change log (decode, assemble, write)
    restore/         3  serves the archive to PostgreSQL's recovery: restore_command's helper and
                        its prefetch spool
    relay/           3  compresses a plain server's stream for receivers over a slow link
    replication/     2  libpq connection (non-blocking; waiting on socket + stop signal),
                        replication commands, the COPY stream (copystream: runs of XLogData,
                        keepalives, the end), CopyData codecs, pg_streampack codec and negotiation
    archive/         2  segment files on disk and in a bucket: layout, writers, compression at
                        rest, durability (the one home of fsync and rename), uploads
    wal/             1  LSNs, file names, timelines, the WAL page and record reader (pure)
    (the top)        0  errors, logs, secrets, addresses, allocator
"""

__version__ = "0.1.0"
