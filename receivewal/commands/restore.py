"""``receivewal restore %f %p``: a restore_command that reads the archive.

PostgreSQL asks for a file by name (``%f``) and a place to put it (``%p``). The archive may hold
the segment plain or compressed (``.gz``, ``.lz4``, ``.zst``); the helper decompresses it into a
temporary file next to ``%p`` and renames it into place, so recovery never sees half a file.

Exit status is what recovery understands: 0 when the file was restored, 1 when the archive does
not have it (recovery then ends cleanly, or a standby goes on to streaming), and 126 when the
archive has the file but it cannot be read or decoded: PostgreSQL treats a status above 125 as
fatal, so a damaged archive stops recovery instead of silently ending it early.

With ``--partial`` the newest ``.partial`` of the asked segment is served when no complete file
exists, padded with zeros to the segment size as PostgreSQL expects: recovery then replays to
the last byte received.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import click

from receivewal.archive.compression import CorruptFile, decompress_chunks
from receivewal.archive.directory import Archive
from receivewal.errors import ReceivewalError
from receivewal.wal.names import COMPRESSION_SUFFIXES, PARTIAL_SUFFIX

NOT_FOUND = 1
DAMAGED = 126
DEFAULT_SEGMENT_SIZE = 16 << 20
_SEGMENT_NAME = re.compile(r"^[0-9A-F]{24}$")
_OTHER_NAME = re.compile(r"^[0-9A-F]{8}\.history$|^[0-9A-F]{24}\.[0-9A-F]{8}\.backup$")


class NotInArchive(ReceivewalError):  # noqa: N818 - names the outcome, as recovery sees it
    """The archive has no file of that name."""


def candidates(directory: Path, name: str, *, partial: bool) -> list[tuple[Path, str, bool]]:
    """(path, compression, is_partial) of the archive files that can serve ``name``, best
    first: complete files (plain, then compressed), then with ``partial`` the ``.partial``
    forms, newest first."""
    if _OTHER_NAME.match(name):
        return [(directory / name, "", False)]
    if not _SEGMENT_NAME.match(name):
        raise click.BadParameter(f'"{name}" is not a WAL segment or history file name')
    found = [(directory / (name + suffix), method, False)
             for method, suffix in COMPRESSION_SUFFIXES.items()]
    if partial:
        partials = [(directory / (name + suffix + PARTIAL_SUFFIX), method, True)
                    for method, suffix in COMPRESSION_SUFFIXES.items()]
        found += sorted((c for c in partials if c[0].exists()),
                        key=lambda c: c[0].stat().st_mtime_ns, reverse=True)
    return found


def restore_file(directory: Path, name: str, target: Path, *, partial: bool = False) -> Path:
    """Restore ``name`` from the archive to ``target`` atomically; return the source file.

    Raises NotInArchive when no form of the file exists, CorruptFile or OSError when one
    exists but cannot be read.
    """
    for path, method, is_partial in candidates(directory, name, partial=partial):
        try:
            source = path.open("rb")
        except FileNotFoundError:
            continue
        with source:
            pad_to = segment_size(directory) if is_partial else 0
            _copy_atomically(decompress_chunks(source, method, truncated_ok=is_partial),
                             target, pad_to)
        return path
    raise NotInArchive(f'"{name}" is not in the archive "{directory}"')


def segment_size(directory: Path) -> int:
    """The archive's segment size, from its identity file (16 MB when it has none)."""
    identity = Archive(directory).read_identity()
    return identity.segment_size if identity else DEFAULT_SEGMENT_SIZE


def _copy_atomically(chunks: Iterable[bytes], target: Path, pad_to: int) -> None:
    tmp = target.with_name(f".{target.name}.receivewal-restore-{os.getpid()}")
    try:
        with tmp.open("wb") as out:
            written = _write_chunks(out, chunks, pad_to)
            if pad_to > written:
                out.truncate(pad_to)  # zeros: where the received WAL ends
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_chunks(out: BinaryIO, chunks: Iterable[bytes], limit: int) -> int:
    """Write every chunk; refuse more than ``limit`` bytes (0: no limit)."""
    written = 0
    for chunk in chunks:
        written += len(chunk)
        if written > limit > 0:
            raise CorruptFile(f"holds more than a segment ({limit} bytes)")
        out.write(chunk)
    return written


@click.command("restore")
@click.argument("wal_name")
@click.argument("target", type=click.Path(path_type=Path, dir_okay=False))
@click.option("-D", "--directory", type=click.Path(path_type=Path, file_okay=False),
              envvar="RECEIVEWAL_DIRECTORY", required=True,
              help="The archive directory (receivewal stream's -D; "
              "env RECEIVEWAL_DIRECTORY).")
@click.option("--partial", is_flag=True,
              help="Serve the newest .partial of a segment that has no complete file "
              "(recovery to the last byte received).")
def restore_command(wal_name: str, target: Path, directory: Path, partial: bool) -> int:
    """restore_command helper: copy WAL_NAME (%f) from the archive to TARGET (%p).

    Decompresses .gz, .lz4 and .zst files. Exits 1 when the archive lacks the file, 126 when
    the archive's file is damaged (PostgreSQL then stops recovery rather than end it early).
    """
    try:
        source = restore_file(directory, wal_name, target, partial=partial)
    except NotInArchive as exc:
        click.echo(f"receivewal restore: {exc}", err=True)
        return NOT_FOUND
    except (CorruptFile, OSError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        click.echo(f'receivewal restore: error: cannot restore "{wal_name}" from '
                   f'"{directory}": {detail}', err=True)
        return DAMAGED
    click.echo(f'receivewal restore: restored "{wal_name}" from "{source.name}"', err=True)
    return 0
