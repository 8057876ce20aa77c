"""The streaming daemon's shared core: the supervisor that runs a receiver, reconnects and
stops, one session's COPY loop, the event stream, settings, and what it tells the outside
(state file and the health verdict `status` gives, metrics, systemd notifications). The
receivers stand on it: :mod:`receivewal.walreceiver` (the WAL archive's) and the logical
change log's (:mod:`receivewal.logicalreceiver`).
"""
