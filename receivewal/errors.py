"""The project's exceptions.

Every error raised on purpose derives from :class:`ReceivewalError`. Each class says whether
retrying can help (``retryable``), and that attribute is the whole truth: the supervisor asks
it and nothing else when it decides to retry or to exit.
"""

from __future__ import annotations

import errno

#: The errno values of a process or system out of file descriptors: retryable, they say
#: nothing about the file being opened.
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


class ReceivewalError(Exception):
    """Root of every error this package raises on purpose.

    ``final``: not even a new start of the program can help (the same refusal at the same
    place every time): the supervisor exits with the status the service unit does not restart,
    and an operator must act. A final error is never retryable. ``hint``: what the operator can
    do about it, logged beside the message (the drop-in keeps pg_receivewal's words alone)."""

    retryable: bool = False
    final: bool = False
    hint: str | None = None


class ConfigurationError(ReceivewalError):
    """Bad options or settings: retrying with the same input cannot help."""


class CommandLineError(ConfigurationError):
    """Options that do not go together, or one that is missing: the command line cannot run
    as given. ``words`` says it as pg_receivewal does (the drop-in prints them, with its
    "Try --help" hint); the message adds the option to give, where there is one."""

    def __init__(self, words: str, option: str = "") -> None:
        super().__init__(f"{words} ({option})" if option else words)
        self.words = words


class ConnectionLost(ReceivewalError):  # noqa: N818 - a state, as the brief names it
    """The server went away or could not be reached; a later attempt may succeed."""

    retryable = True


class StopRequested(ReceivewalError):  # noqa: N818 - a state, not a failure
    """A stop signal arrived while waiting on the server; the supervisor exits 0."""


class ServerError(ReceivewalError):
    """The server refused a command, or is not a server we can stream from.

    Retryable: the server may change its mind (a slot created, recovery finished, a standby
    promoted, the operator fixing a setting) while the daemon waits and reconnects.
    """

    retryable = True

    def __init__(self, message: str, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StreamRefused(ServerError):  # noqa: N818 - the server's answer
    """The server refuses a logical slot's stream with an error the slot meets again at the
    same position on every start (``publication "p" does not exist``): retrying, or
    restarting, cannot help; the slot holds WAL until an operator acts."""

    retryable = False
    final = True


class WalRemovedError(ServerError):
    """The server no longer has WAL the archive needs next.

    Skipping ahead would leave a silent hole in the archive, so the supervisor keeps retrying
    (the WAL may come back, e.g. from a restored server) and reports the gap until an operator
    decides (retryable, as every ServerError).
    """


class ProtocolError(ReceivewalError):
    """A message from the server broke the replication protocol.

    Nothing from the offending message is written. A new connection restarts the stream from
    what is durable on disk, so retrying is safe.
    """

    retryable = True


class ChangeStreamError(ProtocolError):
    """A logical replication message that cannot be decoded or assembled: malformed, of an
    unknown type, about a relation never announced, or outside what the server agreed to.

    The slot sends the same message again on every connection, so retrying cannot help: the
    logical receiver exits, naming the LSN (nothing of the message's transaction is
    written)."""

    retryable = False


class StreampackError(ProtocolError):
    """A pg_streampack frame could not be decoded (bad header, length, or body)."""


class ArchiveError(ReceivewalError):
    """The archive directory is inconsistent, unusable, or belongs to another cluster."""


class ForeignArchive(ArchiveError):  # noqa: N818 - a state, as the brief names errors
    """The archive (a directory, or a bucket prefix by its identity object) holds another
    database system's WAL, or segments of another size."""


class SlotAheadOfLog(ArchiveError):  # noqa: N818 - a state
    """A logical slot confirmed past what the change log holds: what committed in between is
    in neither, and no start can change that without an operator (``--accept-gap``)."""

    final = True


class ArchiveNotDurable(ArchiveError):  # noqa: N818 - a state
    """A stop signal came while the disk had not yet made the newest WAL durable, and the
    stop could not wait for it any longer: that WAL was never reported as flushed."""


class DiskFullError(ArchiveError):
    """The archive's file system ran out of space; retrying once space returns helps."""

    retryable = True


class DescriptorLimitError(ArchiveError):
    """The process or the system ran out of file descriptors (EMFILE, ENFILE) while opening
    an archive file; retryable: descriptors come back as other files and sockets close."""

    retryable = True


class StoreError(ReceivewalError):
    """The object store could not be reached or failed a request (connection refused, timeout,
    a 5xx, throttling, an upload damaged in transit); a later attempt may succeed."""

    retryable = True


class StoreAccessDenied(StoreError):  # noqa: N818 - the store's answer, as S3 names it
    """The object store rejected the credentials or the permissions (403, no credentials).

    Retryable: credentials are rotated, roles refreshed and bucket policies fixed while the
    daemon keeps WAL on local disk. Never a "no such key": restore exits 126 after its retries.
    """


class StoreRefused(StoreError):  # noqa: N818 - the store's answer
    """The object store refused a request that cannot succeed as it stands (no such bucket, an
    invalid request): retrying the same request cannot help."""

    retryable = False


class ObjectNotFound(StoreError):  # noqa: N818 - a definite answer, as S3 names it
    """The store said definitely that the key does not exist (restore exits 1 only for this)."""

    retryable = False


class ObjectConflict(ArchiveError):  # noqa: N818 - a state, as the store reports it
    """A create-only upload found a different object at its key: the object stays as it was,
    and nothing is overwritten, ever."""
