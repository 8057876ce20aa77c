"""One listing of the archive directory, taken once and handed to every step that reads it.

At start-up the lock holder removes a crash's temporary files, the session looks for the
identity's evidence, the resume point, the islands and the ``.partial`` forms to settle, and the
uploader takes its backlog: all from the one listing the lock took (the directory has had no
other writer since). Each later connection takes a listing of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from receivewal.wal.names import SegmentFile, parse_archive_segment_name


@dataclass(frozen=True)
class Listing:
    """The entries of an archive directory at one moment (``os.scandir``'s, whose file types
    are cached: asking whether an entry is a file costs no system call on most file systems).
    ``removed`` names the temporary files the lock holder removed after listing."""

    directory: Path
    entries: tuple[os.DirEntry[str], ...]
    removed: tuple[str, ...] = ()

    @classmethod
    def take(cls, directory: Path) -> Listing:
        """List ``directory`` (one ``os.scandir``)."""
        with os.scandir(directory) as found:
            return cls(directory, tuple(found))

    def without(self, names: Iterable[str]) -> Listing:
        """This listing once ``names`` were removed from the directory (and recorded so)."""
        gone = set(names)
        return Listing(self.directory, tuple(e for e in self.entries if e.name not in gone),
                       (*self.removed, *sorted(gone)))

    def segments(self, segment_size: int) -> list[SegmentFile]:
        """Every segment file, by name only (nothing is opened); a sealed one (``.age``) has
        ``encrypted`` set."""
        return [parsed for entry in self.entries
                if (parsed := parse_archive_segment_name(entry.name, segment_size)) is not None
                and entry.is_file()]
