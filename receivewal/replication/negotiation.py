"""pg_streampack negotiation: the ``--compression`` list and the libpq ``options`` that carry it.

A client asks a walsender for compressed XLogData with ``-c pg_streampack.requested=<list>`` in
its connection ``options``. This module parses the list a user gives, and adds, finds or
removes that setting in an ``options`` value (the relay reads it from its clients' startup
packets). Pure: no IO. The frames themselves are :mod:`receivewal.replication.streampack`'s.
"""

from __future__ import annotations

from receivewal.errors import ConfigurationError
from receivewal.replication.streampack import ALGORITHMS

GUC_NAME = "pg_streampack.requested"


def parse_compression_list(text: str) -> tuple[str, ...]:
    """Parse ``--compression``: a comma list of ``zstd``/``lz4`` (any case), or ``none``.

    Returns the algorithms in the order given (the order is the preference the server follows),
    ``()`` for ``none``. The server refuses a connection whose request names an unknown
    algorithm or one twice, so such a list is refused here, before connecting.
    """
    items = [item.strip().lower() for item in text.split(",")]
    if items == ["none"]:
        return ()
    seen: list[str] = []
    for item in items:
        if not item:
            raise ConfigurationError(
                f"invalid compression list {text!r}: empty item (expected e.g. zstd,lz4 or none)"
            )
        if item == "none":
            raise ConfigurationError(
                f"invalid compression list {text!r}: none cannot be combined with algorithms"
            )
        if item not in ALGORITHMS:
            raise ConfigurationError(
                f"invalid compression list {text!r}: unknown algorithm {item!r} "
                f"(known: {', '.join(ALGORITHMS)}, or none)"
            )
        if item in seen:
            raise ConfigurationError(
                f"invalid compression list {text!r}: {item} is named twice"
            )
        seen.append(item)
    return tuple(seen)


def split_options(options: str) -> list[str]:
    """Split a libpq ``options`` value into words as the server does (backslash escapes)."""
    words: list[str] = []
    current: list[str] | None = None
    chars = iter(options)
    for char in chars:
        if char.isspace():
            if current is not None:
                words.append("".join(current))
                current = None
            continue
        if current is None:
            current = []
        if char == "\\":
            current.append(next(chars, ""))
        else:
            current.append(char)
    if current is not None:
        words.append("".join(current))
    return words


def join_options(words: list[str]) -> str:
    """Join words into a libpq ``options`` value, escaping backslashes and whitespace."""
    escaped = []
    for word in words:
        out = []
        for char in word:
            if char == "\\" or char.isspace():
                out.append("\\")
            out.append(char)
        escaped.append("".join(out))
    return " ".join(escaped)


def _setting_name(assignment: str) -> str:
    return assignment.partition("=")[0].strip().lower().replace("-", "_")


def take_streampack_option(options: str | None) -> tuple[str | None, str | None]:
    """Remove every ``pg_streampack.requested`` setting from a libpq ``options`` value.

    Returns ``(remaining options or None when nothing is left, the last requested value or
    None)``. Understands the three spellings the server accepts: ``-c name=value``,
    ``-cname=value`` and ``--name=value``.
    """
    if options is None:
        return None, None
    words = split_options(options)
    kept: list[str] = []
    requested: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        assignment: str | None = None
        width = 1
        if word == "-c" and i + 1 < len(words):
            assignment, width = words[i + 1], 2
        elif word.startswith(("-c", "--")):
            assignment = word[2:]
        if assignment is not None and "=" in assignment and (
            _setting_name(assignment) == GUC_NAME
        ):
            requested = assignment.partition("=")[2]
        else:
            kept.extend(words[i : i + width])
        i += width
    return (join_options(kept) if kept else None), requested


def with_streampack_option(options: str | None, algorithms: tuple[str, ...]) -> str | None:
    """The libpq ``options`` value that asks the server for ``algorithms``.

    Keeps whatever the user passed and replaces an earlier ``pg_streampack.requested``.
    With no algorithms the options are returned unchanged (nothing is requested).
    """
    if not algorithms:
        return options
    remaining, _ = take_streampack_option(options)
    words = split_options(remaining) if remaining else []
    words += ["-c", f"{GUC_NAME}={','.join(algorithms)}"]
    return join_options(words)
