"""One connection's COPY stream as the session reads and answers it, in three kinds of message.

:class:`CopyStream` is the session's side of START_REPLICATION's COPY BOTH: what it reads is a
:class:`~receivewal.replication.link.WalRun` (XLogData messages back to back, pg_streampack
frames already restored), a :class:`~receivewal.replication.messages.PrimaryKeepalive`, or
:data:`~receivewal.replication.link.COPY_DONE`; what it sends is the standby status update
(``r``, and hot standby feedback ``h``) and, to stop, its own CopyDone. Where the message came
from (the compiled receive loop's run, or one CopyData payload parsed and decoded in Python)
stays here: a run of one message is a run like any other. The pg_streampack decoder lives as
long as the connection, across timeline switches.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from receivewal.errors import ConnectionLost
from receivewal.replication.link import COPY_DONE, CopyDone, ReplicationLink, ResultStatus, WalRun
from receivewal.replication.messages import (
    PrimaryKeepalive,
    XLogData,
    build_hot_standby_feedback,
    build_standby_status_update,
    parse_copy_data,
    postgres_time,
)
from receivewal.replication.streampack import StreampackDecoder, StreampackStats

#: What the session reads: WAL (or a logical stream's messages), a keepalive, the end.
Incoming = WalRun | PrimaryKeepalive | CopyDone


class CopyStream:
    """The COPY stream of one connection (``link``), pg_streampack-decoded as ``compression``
    asked (the algorithms requested; empty: none)."""

    def __init__(self, link: ReplicationLink, compression: tuple[str, ...], *,
                 scattered: bool = False) -> None:
        self.link = link
        self.scattered = scattered  # a logical stream: runs of messages whatever their starts
        self.decoder = StreampackDecoder(compression)
        self._read_xlogdata = self.decoder.decode  # bound once: parse_copy_data calls it

    @property
    def algorithm(self) -> str | None:
        """The stream's compression, known from its first compressed frame (None: plain)."""
        return self.decoder.algorithm

    def stats(self) -> StreampackStats:
        """The decoder's counts on this connection so far."""
        return self.decoder.stats()

    def start(self, command: str) -> None:
        """Send START_REPLICATION ``command``; the server enters COPY BOTH."""
        self.link.start_copy_both(command)

    def read(self, timeout: float, until: int | None = None) -> Incoming | None:
        """The next message: None when none arrived within ``timeout`` seconds (0: only what
        has arrived) or a stop signal came meanwhile. XLogData messages that arrived back to
        back come as one run, up to the one that reaches LSN ``until``."""
        message = self.link.read_batch(timeout, until, self.scattered)
        if message is None or message is COPY_DONE:
            return message
        if isinstance(message, WalRun):  # plain frames, from the compiled receive loop
            self.decoder.count_plain(len(message.payload), message.wire)
            return message
        received = parse_copy_data(message, self._read_xlogdata)
        if isinstance(received, XLogData):
            return WalRun(received.wal_start, received.wal_end, [memoryview(received.payload)],
                          len(message))
        return received

    def send_status(self, write: int, flush: int, *, reply_requested: bool = False,
                    feedback: bool = True) -> None:
        """Send a standby status update (``r``: ``write``, ``flush``, no apply position) and,
        with ``feedback``, hot standby feedback that holds nothing back (``h``)."""
        now = postgres_time(time.time())
        self.link.send_copy(build_standby_status_update(write, flush, 0, now, reply_requested))
        if feedback:
            self.link.send_copy(build_hot_standby_feedback(now))

    def end(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Stop on our side: send CopyDone, let the server end its side within ``timeout``
        seconds (what it still sends is dropped), and read its results. Raises ConnectionLost
        when it does not."""
        self.link.end_copy()
        deadline = clock() + timeout
        while clock() < deadline:
            if self.link.read_copy(max(0.0, deadline - clock())) is COPY_DONE:
                break
        else:
            raise ConnectionLost("server did not end the stream after we stopped")
        while (result := self.link.next_result()) is not None:
            if result.status not in (ResultStatus.COMMAND_OK, ResultStatus.TUPLES_OK):
                break
