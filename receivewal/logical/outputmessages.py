"""The messages of the logical replication protocols, as frozen dataclasses (pure).

Named and laid out as PostgreSQL's documentation of pgoutput's "Logical Replication Message
Formats" names them (protocol versions 1 to 4); the pglogical_output plugin's native protocol
has the same kinds of transaction and row messages (Begin, Commit, Origin, a relation's
metadata, Insert, Update, Delete) and is decoded into the same classes, plus its
:class:`Startup` message. LSNs are integers; times are PostgreSQL's, microseconds since
2000-01-01 00:00 UTC. ``xid`` on a change is the (sub)transaction's id that pgoutput sends
inside a stream of an in-progress transaction (protocol 2 and later), None elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

# The kinds of a column value in TupleData: NULL, unchanged TOAST (not sent), text, binary
# (the type's send function) and pglogical's internal format (the server's own datum).
NULL = "n"
UNCHANGED_TOAST = "u"
TEXT = "t"
BINARY = "b"
INTERNAL = "i"


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row: ``kinds`` has one character per column (see the constants above) and
    ``values`` the bytes sent for it (None for NULL and unchanged TOAST)."""

    kinds: str
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts: ``final_lsn`` is its commit record's LSN."""

    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """The transaction that Begin started has committed."""

    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    """The transaction came from another node (its replication origin)."""

    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message: ``key`` when it is part of the replica identity.
    pglogical_output sends no type (``type_id`` and ``type_modifier`` are None)."""

    key: bool
    name: str
    type_id: int | None
    type_modifier: int | None


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's description, announced before rows of it are sent (``replica_identity`` is
    pgoutput's relreplident: ``d``, ``n``, ``f`` or ``i``; None from pglogical_output)."""

    xid: int | None
    relation_id: int
    namespace: str
    relation_name: str
    replica_identity: str | None
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """A data type's name, announced before a Relation with a column of that type."""

    xid: int | None
    type_id: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``old_kind`` is ``K`` (the old key), ``O`` (the whole old row) or None (none sent)."""

    xid: int | None
    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """``old_kind`` is ``K`` (the old key) or ``O`` (the whole old row)."""

    xid: int | None
    relation_id: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``); ``lsn`` is its record's."""

    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A block of an in-progress transaction's changes starts (protocol 2)."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The block that StreamStart opened ends."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed transaction (``subxid == xid``) or one of its subtransactions aborted.
    ``abort_lsn`` and ``abort_time`` come with protocol 4's parallel streaming only."""

    xid: int
    subxid: int
    abort_lsn: int | None
    abort_time: int | None


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """What Begin Prepare, Prepare and Stream Prepare say of a two-phase transaction."""

    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class BeginPrepare(PreparedTransaction):
    """A transaction that will be prepared starts (protocol 3, two-phase)."""


@dataclass(frozen=True, slots=True)
class Prepare(PreparedTransaction):
    """The transaction that Begin Prepare started has been prepared."""


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare(PreparedTransaction):
    """A streamed transaction has been prepared (protocol 3, two-phase with streaming)."""


@dataclass(frozen=True, slots=True)
class Startup:
    """pglogical_output's first message: the parameters it runs with, in the order sent."""

    version: int
    parameters: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        """The value of one parameter, None when it was not sent."""
        return next((value for key, value in self.parameters if key == name), None)


LogicalMessage = (Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
                  | Message | StreamStart | StreamStop | StreamCommit | StreamAbort
                  | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare
                  | Startup)
