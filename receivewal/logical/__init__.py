"""Logical change streams kept as a change log: decode, assemble, write exactly once.

The flow of one logical replication connection, top to bottom:

    consumer     the interface a session drives: receive(walStart, payload), keepalive,
                 flush() -> the LSN the slot may be confirmed to, close()
    pgoutput     pgoutput's messages, protocol versions 1 to 4 (pure)
    pglogical    pglogical_output's native protocol: Startup and change messages (pure)
    reader       the cursor both decoders read a message with; errors name the LSN (pure)
    messages     the decoded messages as frozen dataclasses, named as the protocols name them
    assembly     transactions from messages: runs in commit order, streams spooled per xid,
                 subtransaction and stream aborts, two-phase
    relations    tables and types announced, scoped to streams until they commit (pure)
    records      the change log's lines, format 1 (pure)
    binary       binary column values as PostgreSQL's text output (pure)
    pgtime       PostgreSQL's dates and times as text (pure)
    typenames    the built-in types' names by OID (pure data)
    spool        a transaction's lines until it commits: memory, then a scratch file
    store        the change log files: partial, rotation, zstd, fsync, crash recovery
    scan         reading a change log file back to its last complete run (pure)

Every fsync and rename goes through :mod:`receivewal.archive.durable`; nothing here opens a
connection (the session hands payloads over).
"""
