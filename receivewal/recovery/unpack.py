"""A backup unpacked into a new data directory, and the recovery files written into it.

:func:`unpack_backup` refuses a data directory or tablespace directory that is not empty,
then reads each tar of the backup (decompressed as it is read) through
:class:`~receivewal.backup.tar.TarReader` and writes its members: the main tar into the
data directory, each tablespace's into its directory on the server or the one the mapping
gives. Every file is checked against the backup's manifest on the way (size and checksum,
each listed file once: a backup damaged at rest is refused), written with ``O_EXCL`` and
``O_NOFOLLOW`` under directories this unpack made (never through a symbolic link), and made
durable through :mod:`receivewal.archive.durable`: one sync of each directory's file system
at the end (:class:`~receivewal.archive.durable.FileSystemSync`, as durable as an fsync of
every file and directory, at the cost of ``sync -f``), or, where that does not hold, an fsync
of each. A ``tablespace_map`` is rewritten with the
mapped directories: PostgreSQL makes the ``pg_tblspc`` links from it when it starts.

:func:`write_recovery` rewrites ``postgresql.auto.conf`` without the recovery settings the
backup inherited (a backup of a recovered server holds that recovery's target) and appends
recover's own block (:mod:`receivewal.recovery.recoveryconf`), writes ``recovery.signal`` (and
removes a ``standby.signal`` the backup may hold). It names what it removed, and the same
settings in ``postgresql.conf`` and the files it includes, which the block overrides.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.durable import (
    FileSystemSync,
    start_writeback,
    sync_path,
    write_all,
    write_file_durably,
)
from receivewal.archive.reading import read_small_file
from receivewal.backup.record import BackupRecord, StoredArchive
from receivewal.backup.stored import (
    BackupFiles,
    manifest_check,
    read_members,
    stored_manifest,
)
from receivewal.backup.tar import MemberData, MemberKind, MemberStart, TarEvent
from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.recovery.recoveryconf import (
    auto_conf_lines,
    include_directives,
    recovery_lines,
    without_recovery_settings,
)

TABLESPACE_MAP = "tablespace_map"
AUTO_CONF = "postgresql.auto.conf"
MAIN_CONF = "postgresql.conf"
_INCLUDE_DEPTH = 10  # PostgreSQL's own limit of nested configuration files
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Unpacked:
    """Where a backup went: the data directory, each tablespace's directory by OID."""

    pgdata: Path
    tablespaces: dict[int, Path]
    files: int
    bytes: int


def tablespace_directories(record: BackupRecord, mapping: Mapping[str, str]) -> dict[int, Path]:
    """Each tablespace's directory: its location on the server, or where ``mapping`` (old
    location to new) moves it; ConfigurationError for a mapping of no tablespace."""
    locations = {a.location: a.tablespace_oid for a in record.archives
                 if a.tablespace_oid is not None}
    unknown = sorted(set(mapping) - set(locations))
    if unknown:
        raise ConfigurationError(f"tablespace mapping of {unknown[0]!r}: backup "
                                 f"{record.backup_id} has no tablespace there")
    found: dict[int, Path] = {}
    for location, oid in locations.items():
        assert oid is not None
        target = Path(mapping.get(location, location))
        if not target.is_absolute():
            raise ConfigurationError(f"tablespace directory {str(target)!r} is not absolute")
        found[oid] = target
    return found


def refuse_unless_empty(path: Path, what: str) -> None:
    """ArchiveError unless ``path`` is missing or an empty directory."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise ArchiveError(f"{what} {path} exists and is not a directory")
    if any(path.iterdir()):
        raise ArchiveError(f"{what} {path} is not empty: recover writes only into an empty "
                           "or new directory")


def unpack_backup(backup_dir: Path | BackupFiles, record: BackupRecord, pgdata: Path, *,
                  mapping: Mapping[str, str] | None = None, sync: bool = True,
                  on_progress: Callable[[int], None] | None = None) -> Unpacked:
    """Unpack the backup of ``record`` (in ``backup_dir``) into ``pgdata`` (see the module's
    docstring); ``on_progress`` is told the bytes of files written so far as they grow."""
    targets = tablespace_directories(record, mapping or {})
    refuse_unless_empty(pgdata, "data directory")
    for target in targets.values():
        refuse_unless_empty(target, "tablespace directory")
    manifest = stored_manifest(backup_dir, record)
    check = manifest_check(manifest, record)
    files = size = 0
    durable = FileSystemSync(sync=sync)
    try:
        for archive in sorted(record.archives, key=lambda a: a.tablespace_oid is None):
            root = pgdata if archive.tablespace_oid is None else targets[archive.tablespace_oid]
            extractor = _Extractor(root, archive, targets, durable, on_progress=on_progress,
                                   before=size)
            extractor.run(read_members(backup_dir, archive, check))
            files, size = files + extractor.files, size + extractor.bytes
        check.compare(manifest)
        _rewrite_tablespace_map(pgdata, targets, sync=sync)
        _finish(durable, pgdata)
    except ArchiveError as exc:
        durable.close()
        left = " and ".join(str(p) for p in [pgdata, *targets.values()] if p.exists())
        raise type(exc)(f"{exc} ({left} left incomplete: remove before recovering again)"
                        if left else str(exc)) from exc
    except BaseException:
        durable.close()
        raise
    return Unpacked(pgdata, targets, files, size)


def _finish(durable: FileSystemSync, pgdata: Path) -> None:
    """Every file and directory written made durable by one sync of each file system."""
    try:
        durable.finish()
    except OSError as exc:
        raise ArchiveError(f'could not sync the files written under "{pgdata}" to disk: '
                           f"{exc.strerror or exc}") from exc


class _Extractor:
    """One archive's members written under ``root``: each file and directory fsynced at the
    end, or, where one sync of the file system is as durable (``durable``), none of them."""

    def __init__(self, root: Path, archive: StoredArchive, targets: Mapping[int, Path],
                 durable: FileSystemSync, *, on_progress: Callable[[int], None] | None = None,
                 before: int = 0) -> None:
        self.root, self.archive = root, archive
        self.targets, self.durable = targets, durable
        self.sync = durable.by_files  # each file and directory fsynced on its own
        self.made: list[Path] = []  # directories made, fsynced at the end
        self.written: list[Path] = []  # files written, their writeback started, fsynced last
        self.known: set[Path] = set()
        self.links: set[str] = set()
        self.files = self.bytes = 0
        self.fd = -1
        self.on_progress, self.before, self.written_bytes = on_progress, before, 0

    def run(self, events: Iterator[TarEvent]) -> None:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)  # PostgreSQL refuses a data directory others can enter
            self.durable.watch(self.root)  # before anything is written under it
        except OSError as exc:
            raise ArchiveError(f'could not create directory "{self.root}": '
                               f"{exc.strerror or exc}") from exc
        self.known.add(self.root)
        try:
            for event in events:
                self._event(event)
            for path in self.written:
                sync_path(path, sync=self.sync)
            for directory in reversed(self.made):
                sync_path(directory, sync=self.sync)
        except OSError as exc:
            raise ArchiveError(f'could not unpack into "{self.root}": '
                               f"{exc.strerror or exc}") from exc
        finally:
            if self.fd >= 0:
                os.close(self.fd)

    def _event(self, event: TarEvent) -> None:
        if isinstance(event, MemberData):
            write_all(self.fd, event.data)
            if self.on_progress is not None:
                self.written_bytes += len(event.data)
                self.on_progress(self.before + self.written_bytes)
        elif isinstance(event, MemberStart):
            self._start(event)
        elif event.member.kind is MemberKind.FILE:
            # written back while the next files are decoded, whichever sync makes it durable
            start_writeback(self.fd, sync=self.durable.sync)
            os.utime(self.fd, (event.member.mtime, event.member.mtime))
            os.close(self.fd)
            self.fd = -1
            if self.sync:
                self.written.append(self.root / event.member.name)
            self.files, self.bytes = self.files + 1, self.bytes + event.member.size

    def _start(self, event: MemberStart) -> None:
        member = event.member
        steps = member.name.split("/")
        if any("/".join(steps[:n]) in self.links for n in range(1, len(steps) + 1)):
            raise ArchiveError(f"member {member.name!r} lies under a symbolic link")
        target = self.root / member.name
        self._directory(target.parent)
        if member.kind is MemberKind.DIRECTORY:
            self._directory(target, member.mode)
        elif member.kind is MemberKind.SYMLINK:
            self._symlink(member.name)
        else:
            self.fd = os.open(target, _FILE_FLAGS, member.mode & 0o777 or 0o600)

    def _symlink(self, name: str) -> None:
        """pg_tblspc/<oid> only (the backup was taken without a tablespace map), pointing at
        the tablespace's directory (the server's, or the mapping's)."""
        parent, _, oid = name.rpartition("/")
        if self.archive.tablespace_oid is not None or parent != "pg_tblspc" \
                or not oid.isdigit() or int(oid) not in self.targets:
            raise ArchiveError(f"symbolic link {name!r} is not a tablespace's link")
        os.symlink(self.targets[int(oid)], self.root / name)
        self.links.add(name)

    def _directory(self, path: Path, mode: int = 0o700) -> None:
        """``path`` as a real directory, made (with its parents) when missing."""
        if path in self.known:
            return
        self._directory(path.parent)
        try:
            os.mkdir(path, (mode & 0o7777) | 0o700)
            self.made.append(path)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise ArchiveError(f"{path} exists and is not a directory") from None
        self.known.add(path)


def tablespace_map_entries(text: str) -> list[tuple[str, str]]:
    """The (OID, directory) lines of a ``tablespace_map``: a backslash makes the next
    character (a newline, a carriage return, a backslash) part of the directory."""
    entries: list[tuple[str, str]] = []
    line: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            line.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "\r\n":
            if line:
                oid, _, directory = "".join(line).partition(" ")
                entries.append((oid, directory))
            line = []
        else:
            line.append(char)
    if line or escaped:
        raise ValueError("tablespace_map does not end with a line break")
    return entries


def _rewrite_tablespace_map(pgdata: Path, targets: Mapping[int, Path], *, sync: bool) -> None:
    """``tablespace_map`` with each tablespace's new directory (backslash-escaped as
    PostgreSQL writes and reads it)."""
    path = pgdata / TABLESPACE_MAP
    if not path.exists():
        return
    text = read_small_file(path).decode("utf-8", "surrogateescape")
    try:
        entries = tablespace_map_entries(text)
    except ValueError as exc:
        raise ArchiveError(f"{path}: {exc}") from None
    lines = []
    for oid, _old in entries:
        if not oid.isdigit() or int(oid) not in targets:
            raise ArchiveError(f"{path}: tablespace {oid[:20]!r} is not one of the backup's")
        escaped = "".join("\\" + c if c in "\\\n\r" else c for c in str(targets[int(oid)]))
        lines.append(f"{oid} {escaped}\n")
    write_file_durably(pgdata, TABLESPACE_MAP, "".join(lines).encode("utf-8", "surrogateescape"),
                       sync=sync)


@dataclass(frozen=True)
class RecoveryConfig:
    """What :func:`write_recovery` found: the lines it removed from ``postgresql.auto.conf``,
    and the lines of ``postgresql.conf`` (or a file it includes) that set one of the recovery
    settings, each as ``file:line: text`` (recover's block overrides them)."""

    removed: tuple[str, ...]
    overridden: tuple[str, ...]


def write_recovery(pgdata: Path, settings: list[tuple[str, str]], *,
                   sync: bool = True) -> RecoveryConfig:
    """Rewrite ``postgresql.auto.conf`` without the recovery settings it holds and with
    ``settings`` appended, write ``recovery.signal``, remove a ``standby.signal``."""
    try:
        current = read_small_file(pgdata / AUTO_CONF).decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        current = ""
    kept, removed = without_recovery_settings(current)
    if kept and not kept.endswith("\n"):
        kept += "\n"
    write_file_durably(pgdata, AUTO_CONF, (kept + auto_conf_lines(settings))
                       .encode("utf-8", "surrogateescape"), sync=sync)
    (pgdata / "standby.signal").unlink(missing_ok=True)
    write_file_durably(pgdata, "recovery.signal", b"", sync=sync)
    return RecoveryConfig(tuple(removed), tuple(_configured(pgdata / MAIN_CONF, set())))


def _configured(path: Path, seen: set[Path], depth: int = 0) -> list[str]:
    """The recovery settings' lines in the configuration file ``path`` and the files it
    includes, in the order PostgreSQL reads them (a file it cannot read: said as such)."""
    if path in seen or depth > _INCLUDE_DEPTH:
        return []
    seen.add(path)
    try:
        text = read_small_file(path).decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return []
    except (OSError, ArchiveError) as exc:
        return [f"{path}: not read ({getattr(exc, 'strerror', None) or exc})"]
    found = [f"{path}:{number}: {line}" for number, line in recovery_lines(text)]
    for directive, written in include_directives(text):
        target = path.parent / written
        if directive == "include_dir":
            try:
                names = sorted(p for p in target.iterdir()
                               if p.name.endswith(".conf") and not p.name.startswith("."))
            except OSError:
                continue
            for name in names:
                found += _configured(name, seen, depth + 1)
        else:
            found += _configured(target, seen, depth + 1)
    return found
