"""receivewal: a crash-safe physical WAL archiver for PostgreSQL that speaks pg_streampack.

The subpackages follow the path of a WAL byte, top to bottom; a layer imports only the layers
below it:

    commands/     click: parse options, build settings, hand over
    daemon/       supervisor (signals, reconnects, exit codes) running a receiver (the WAL
                  archive's: walreceiver) and its sessions (session: startpoint, then the COPY
                  loop, copyloop, driving a consumer, archivefeed); one event stream (events,
                  lifecycle) and what it tells the outside (monitor, state file, metrics)
    replication/  libpq connection (non-blocking; waiting on socket + stop signal), replication
                  commands, the COPY stream (copystream: runs of XLogData, keepalives, the
                  end), CopyData codecs, pg_streampack codec and its negotiation
    archive/      segment files on disk: layout, writers, compression at rest, durability
    wal/          LSNs, file names, timelines, the WAL page and record reader

Beside that path: ``check/`` reads archives back (verify, analyze), ``relay/`` compresses a
plain server's stream for receivers over a slow link, and ``logical/`` keeps a logical change
stream (issue 27): another consumer of the daemon's COPY loop.
"""

__version__ = "0.1.0"
