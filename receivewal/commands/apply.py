"""``receivewal apply -D OUTDIR --to TARGET [--follow]``: a change log made tables.

The snapshot (``logical --create-slot --snapshot``) and every complete committed transaction of
the log, in commit order, exactly once (:mod:`receivewal.apply`). Exits 0 once the target
holds all the log holds; with ``--follow`` it goes on as the log grows until SIGTERM or SIGINT
(exit 0). A failure is one line naming what was not applied: exit 4 for a conflict or a gap in the
log, which a new run cannot fix (the systemd unit stays down), 1 for anything else.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import click

from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.errors import ReceivewalError
from receivewal.secrets import is_private_key, key_given_as_file, redacted

#: The exit status of an error no new run can fix (the daemon's EXIT_STAY_DOWN, which the
#: systemd units do not restart): a conflict, a gap in the log.
STAY_DOWN = 4


class _StaysDown(click.ClickException):
    """A conflict or a gap: a new start cannot fix it (the unit does not restart on it)."""

    exit_code = STAY_DOWN


def _final(exc: Exception) -> bool:
    from receivewal.apply.postgres import ApplyConflict  # noqa: PLC0415 - loaded by now
    from receivewal.apply.source import LogGap  # noqa: PLC0415

    return isinstance(exc, ApplyConflict | LogGap)


@click.command("apply")
@click_option(catalog.DIRECTORY.but(
    required=True, metavar="OUTDIR",
    help="The change log's directory (what receivewal logical writes)."),
    type=click.Path(file_okay=False, path_type=Path))
@click.option("--to", "target", required=True, metavar="CONNSTR|delta:DIR",
              envvar="RECEIVEWAL_APPLY_TO",
              help="The target: a PostgreSQL connection string or URI whose database has the "
              "source's tables, or delta:DIR for Delta Lake tables DIR/<schema>/<table> (DIR a "
              "directory or an s3:// prefix; the delta extra) (env RECEIVEWAL_APPLY_TO).")
@click.option("--follow", is_flag=True,
              help="Once all is applied, wait for more and apply it as it comes, until "
              "SIGTERM or SIGINT (as a service).")
@click_option(catalog.IDENTITY.but(
    help="age identity file that decrypts the sealed change files (.age) "
    f"(env {catalog.IDENTITY.env})."), type=click.Path(dir_okay=False), default=None)
def apply_command(directory: Path, target: str, *, follow: bool, identity: str | None) -> None:
    """Apply a change log's snapshot and transactions to a database or Delta tables, exactly
    once, in commit order; run again, only what is new."""
    if identity and is_private_key(identity):
        raise click.ClickException(key_given_as_file(catalog.IDENTITY.named()))
    from receivewal.apply.run import apply_log  # noqa: PLC0415 - a target's library when run

    stop = {"requested": False}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop["requested"] = True

    previous = [signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)]
    try:
        keys = None
        if identity:
            from receivewal.archive.encryption import load_identity_file  # noqa: PLC0415

            keys = load_identity_file(identity)
        applied = apply_log(directory, target, keys=keys, follow=follow,
                            stopped=lambda: stop["requested"], say=click.echo)
    except (ReceivewalError, OSError) as exc:
        kind = _StaysDown if _final(exc) else click.ClickException
        raise kind(redacted(str(exc))) from exc
    finally:
        for sig, handler in zip((signal.SIGTERM, signal.SIGINT), previous, strict=True):
            signal.signal(sig, handler)
    click.echo(applied.describe())
