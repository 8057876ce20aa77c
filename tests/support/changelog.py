"""Reading a change log directory back, and feeding a consumer, for the tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zstandard

from receivewal.logical.consumer import ChangeLogConsumer, PluginSettings
from receivewal.logical.pgoutput import PgoutputOptions
from receivewal.logical.store import ChangeLogStore, StoreSettings, parse_file_name

Record = dict[str, Any]
Message = tuple[int, bytes]  # (walStart, payload)


def log_files(directory: Path) -> list[Path]:
    """The change log's files in order (complete ones, then the partial one)."""
    named = [(parsed, path) for path in directory.iterdir()
             if (parsed := parse_file_name(path.name)) is not None]
    return [path for _, path in sorted(named, key=lambda item: item[0][0])]


def file_records(path: Path) -> list[Record]:
    data = path.read_bytes()
    if path.name.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [json.loads(line) for line in data.splitlines()]


def read_log(directory: Path) -> list[Record]:
    """Every line of every file, in order."""
    return [record for path in log_files(directory) for record in file_records(path)]


def runs(records: Iterable[Record]) -> list[list[Record]]:
    """The runs: each transaction's lines from begin to its end, or a standalone line;
    header and relation lines left out."""
    found: list[list[Record]] = []
    current: list[Record] | None = None
    for record in records:
        op = record["op"]
        if op in ("header", "relation"):
            continue
        if op in ("begin", "begin_prepare"):
            assert current is None, record
            current = [record]
        elif current is not None:
            current.append(record)
            if op in ("commit", "prepare"):
                found.append(current)
                current = None
        else:
            found.append([record])
    assert current is None, "a run never ended"
    return found


def open_store(directory: Path, **settings: Any) -> ChangeLogStore:
    settings.setdefault("header", (("plugin", "pgoutput"),))
    return ChangeLogStore.open(directory, StoreSettings(**settings))


def consume(store: ChangeLogStore, messages: Iterable[Message],
            options: PgoutputOptions | None = None, plugin: str = "pgoutput",
            memory_limit: int = 4 << 20) -> ChangeLogConsumer:
    """A consumer of ``store`` fed ``messages`` (pgoutput with ``options``, protocol 4 with
    everything when None), flushed; the caller closes it."""
    if options is None and plugin == "pgoutput":
        options = PgoutputOptions(4, streaming="parallel", two_phase=True, binary=True,
                                  messages=True)
    consumer = ChangeLogConsumer(store, PluginSettings(plugin, options), memory_limit)
    for lsn, payload in messages:
        consumer.receive(lsn, payload)
    consumer.flush()
    return consumer
