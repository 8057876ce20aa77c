"""Whose a recovered data directory is: ``recover --owner USER``, and what that user must be
able to do before anything is written.

PostgreSQL runs as its own user (``postgres``) and refuses a data directory it does not own;
it runs the ``restore_command`` as that user too. ``recover`` run as root would leave root's
files and a program path the server's user may not be able to run, and the first start fails
with "Permission denied" in the server's log. So, as root: the owner is ``--owner`` or, by
default, the owner of the data directory's parent; before anything is written that user must
be able to read the archive (a directory: list it, read its identity record), read the
``--identity`` file, and run the restore program (``PREFIX --help``, through the shell, as the
server runs it): an owner given with ``--owner`` who cannot is refused, nothing written; the
default owner is warned about. Afterwards every file and directory written is handed over to
that user.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.identity import IDENTITY_FILE
from receivewal.errors import ConfigurationError

CHECK_TIMEOUT = 60.0  # seconds for each check run as the owner


@dataclass(frozen=True)
class Owner:
    """The user the recovered files go to, with the group ID and groups it runs with."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def owner_named(name: str) -> Owner:
    """The user ``name`` (a name or a numeric ID); ConfigurationError when there is none."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ConfigurationError(f"--owner {name}: no such user") from None
    return Owner(entry.pw_name, entry.pw_uid, entry.pw_gid,
                 tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)))


def choose_owner(name: str | None, pgdata: Path) -> Owner | None:
    """Who the files go to: ``--owner``, or as root the owner of ``pgdata``'s parent (the
    nearest directory that exists); None when the files stay the running user's.
    ConfigurationError for ``--owner`` someone else when not root."""
    if os.geteuid() != 0:
        if name is None:
            return None
        owner = owner_named(name)
        if owner.uid != os.geteuid():
            raise ConfigurationError(f"--owner {name}: only root can give the files to another "
                                     "user; run recover as that user, or as root")
        return None
    if name is not None:
        return owner_named(name)
    parent = pgdata.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    uid = parent.stat().st_uid
    try:
        return owner_named(str(uid))
    except ConfigurationError:
        raise ConfigurationError(f"{parent} is owned by user ID {uid}, which has no name: give "
                                 "the server's user with --owner USER") from None


def _as_owner(owner: Owner, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, user=owner.uid, group=owner.gid,  # noqa: S603 - our own argv
                          extra_groups=list(owner.groups),
                          cwd="/", capture_output=True, text=True, check=False,
                          timeout=CHECK_TIMEOUT, stdin=subprocess.DEVNULL)


def owner_problem(owner: Owner, archive: Path | None, identity: str | None,
                  restore_prefix: str) -> str | None:
    """What ``owner`` cannot do of what the server will do as it (read the archive directory
    (None: a bucket, read with the server's environment), the identity file, run the restore
    program), and what to change; None when it can do all of it."""
    readable: list[tuple[str, str]] = []
    if archive is not None:
        readable.append(("-d", str(archive)))
        if (archive / IDENTITY_FILE).exists():
            readable.append(("-f", str(archive / IDENTITY_FILE)))
    if identity is not None:
        readable.append(("-f", identity))
    for kind, path in readable:
        test = "-r \"$1\" -a -x \"$1\" && ls \"$1\" >/dev/null" if kind == "-d" else "-r \"$1\""
        done = _as_owner(owner, ["sh", "-c", f"test {kind} \"$1\" && test {test}", "sh", path])
        if done.returncode != 0:
            what = "archive directory" if kind == "-d" else \
                "identity file" if path == identity else "archive's identity record"
            return (f"user {owner.name}, who will own the data directory and run the "
                    f"restore_command, cannot read the {what} {path}: give that user read "
                    "access (e.g. add it to the archive's group), or choose another with "
                    "--owner")
    done = _as_owner(owner, ["sh", "-c", f"{restore_prefix} --help >/dev/null"])
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
        return (f"user {owner.name}, who will run the restore_command, cannot run "
                f"'{restore_prefix}' (exit {done.returncode}: {said}): install receivewal where "
                "that user can run it, or give --restore-command-prefix")
    return None


def hand_over(roots: Iterable[Path], owner: Owner) -> None:
    """Every file, directory and link under ``roots`` (and the roots) to ``owner``."""
    for root in roots:
        os.lchown(root, owner.uid, owner.gid)
        for directory, dirs, files in os.walk(root):
            for name in (*dirs, *files):
                os.lchown(os.path.join(directory, name), owner.uid, owner.gid)

