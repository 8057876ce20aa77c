"""The WAL archive's receiver (``receivewal stream`` and the pg_receivewal drop-in), run by
the daemon's supervisor: what it writes and uploads, beside the logical change log's.

    receiver       the Receiver: slot commands, the directory's lock, the uploader, a session
                   per connection, the wait for the uploads before an exit
    session        one connection into the archive: startpoint, then the COPY loop
    startpoint     pg_receivewal's FindStreamingStart: the archive checked against the server
    archivefeed    the archive as the COPY loop's consumer: runs of WAL into the segment writer
    uploader       completed files to object storage, in order, retried without end
    archivemeter   with metrics only: the archive's size and oldest recoverable point

It stands on the daemon's shared core (:mod:`receivewal.daemon`: supervisor, COPY loop,
events, monitor), on :mod:`receivewal.archive` and on the summary of
:mod:`receivewal.retention`; the shared core imports none of it.
"""
