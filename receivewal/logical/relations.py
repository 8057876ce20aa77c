"""What the server told us about tables and types, scoped as the apply worker scopes it (pure).

A Relation (or Type) message outside a stream block describes the table from then on. Inside a
stream block it belongs to that streamed transaction only (its changes may come with DDL that
never commits): it becomes everyone's description when the transaction commits or is prepared
(as PostgreSQL's apply worker replays a spooled stream), and is forgotten when it aborts. Each
announcement that changes a description is a :class:`RelationInfo` with a new version
number, so that a transaction spooled to disk refers to the description its changes were made
with; the server sending the same description again (after a cache invalidation) makes none.
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.logical import outputmessages as m
from receivewal.logical.typenames import built_in_type_name

CATALOG = "pg_catalog"  # pgoutput sends pg_catalog's name as an empty string


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """A column as the change log describes it (``type`` None when the server sent none)."""

    name: str
    type_id: int | None
    type: str | None
    key: bool


@dataclass(frozen=True, slots=True)
class RelationInfo:
    """One announcement of a table: ``lsn`` is where it came, ``version`` its number."""

    version: int
    relation_id: int
    schema: str
    table: str
    columns: tuple[ColumnInfo, ...]
    lsn: int

    @property
    def name(self) -> tuple[str, str]:
        """(schema, table): how the change log's lines name the table."""
        return self.schema, self.table

    @property
    def shape(self) -> tuple[str, str, tuple[ColumnInfo, ...]]:
        """What a relation line says, apart from where it came: two announcements with the
        same shape need one relation line in a file."""
        return self.schema, self.table, self.columns


class RelationMap:
    """The relations and types announced on one connection, globally and per stream."""

    def __init__(self) -> None:
        self._relations: dict[int, RelationInfo] = {}
        self._types: dict[int, str] = {}
        self._stream_relations: dict[int, dict[int, RelationInfo]] = {}
        self._stream_types: dict[int, dict[int, str]] = {}
        self._versions: list[RelationInfo] = []

    def announce(self, relation: m.Relation, lsn: int, stream: int | None) -> RelationInfo:
        """Record a Relation message received at ``lsn``, inside the stream block of
        transaction ``stream`` (None: outside any)."""
        columns = tuple(
            ColumnInfo(column.name, column.type_id, self._type_name(column.type_id, stream),
                       column.key)
            for column in relation.columns)
        info = RelationInfo(len(self._versions), relation.relation_id,
                            relation.namespace or CATALOG, relation.relation_name, columns, lsn)
        known = self.lookup(relation.relation_id, stream)
        if known is not None and known.shape == info.shape:
            info = known  # sent again (the server's cache was invalidated): the same version
        else:
            self._versions.append(info)
        scope = self._relations if stream is None else \
            self._stream_relations.setdefault(stream, {})
        scope[relation.relation_id] = info
        return info

    def announce_type(self, type_message: m.Type, stream: int | None) -> None:
        """Record a Type message (the name of a type that is not built in)."""
        namespace = type_message.namespace
        name = type_message.name if namespace in ("", CATALOG) else \
            f"{namespace}.{type_message.name}"
        scope = self._types if stream is None else self._stream_types.setdefault(stream, {})
        scope[type_message.type_id] = name

    def lookup(self, relation_id: int, stream: int | None) -> RelationInfo | None:
        """The description a change of ``relation_id`` is made with (None: never told)."""
        if stream is not None:
            info = self._stream_relations.get(stream, {}).get(relation_id)
            if info is not None:
                return info
        return self._relations.get(relation_id)

    def version(self, number: int) -> RelationInfo:
        """An announcement by its version number."""
        return self._versions[number]

    def end_stream(self, stream: int, *, committed: bool) -> None:
        """A streamed transaction committed (or was prepared: its descriptions now hold for
        everyone) or aborted (they are forgotten)."""
        relations = self._stream_relations.pop(stream, {})
        types = self._stream_types.pop(stream, {})
        if committed:
            self._relations.update(relations)
            self._types.update(types)

    def _type_name(self, type_id: int | None, stream: int | None) -> str | None:
        if type_id is None:
            return None
        if stream is not None and type_id in self._stream_types.get(stream, {}):
            return self._stream_types[stream][type_id]
        return self._types.get(type_id) or built_in_type_name(type_id)
