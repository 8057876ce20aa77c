"""The logical change log's receiver (``receivewal logical``), run by the daemon's supervisor
beside the WAL archive's: a logical slot's stream written as a change log.

    receiver       the Receiver: slot commands (LOGICAL, TWO_PHASE), OUTDIR's lock, the store
    session        one replication=database connection: the slot checked, the COPY loop
    changefeed     the change log as the COPY loop's consumer
    logicalsettings  the daemon's Settings and the slot's: plugin, publications, the store's

It stands on the daemon's shared core (:mod:`receivewal.daemon`) and on
:mod:`receivewal.logical` (decoding and the change log); the shared core imports none of it.
"""
