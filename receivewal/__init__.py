"""receivewal: a crash-safe physical WAL archiver for PostgreSQL that speaks pg_streampack.

The package reads in the order the data flows:

    connection   (psycopg.pq: the only module that touches libpq)
    messages     (pure codecs for CopyData: XLogData, keepalives, status updates)
    streampack   (pure decoder for pg_streampack-compressed XLogData)
    segments     (pure planning: where received bytes go in which segment file)
    archive      (the only module that writes, fsyncs and renames files)
    session      (one replication connection: identify, start position, COPY loop)
    supervisor   (signals, reconnects, exit codes)
    cli          (click: builds a Settings object and hands it over)
"""

__version__ = "0.1.0"
