"""receivewal: a crash-safe physical WAL archiver for PostgreSQL that speaks pg_streampack.

The subpackages follow the path of a WAL byte, top to bottom; a layer imports only the layers
below it:

    commands/     click: parse options, build settings, hand over
    daemon/       supervisor (signals, reconnects, exit codes) and session (the COPY loop)
    replication/  libpq connection (non-blocking; waiting on socket + stop signal), replication
                  commands, CopyData codecs, pg_streampack codec and its negotiation
    archive/      segment files on disk: layout, writers, compression at rest, durability
    wal/          LSNs, file names, timelines, the WAL page and record reader

Beside that path: ``check/`` reads archives back (verify, analyze), ``restore/`` serves them to
PostgreSQL's recovery (restore_command and its prefetch spool), and ``relay/`` compresses a
plain server's stream for receivers over a slow link.
"""

__version__ = "0.1.0"
