"""Entry point of the ``receivewal`` console script (and ``python -m receivewal``).

A ``restore`` call is PostgreSQL's restore_command, run once per WAL file during recovery, and
recovery waits for each: :mod:`receivewal.commands.restore_options` reads its usual command
line without importing click (or structlog, or psycopg) and :mod:`receivewal.restore.call`
runs it. A plain ``verify``
command line is read and run the same way by :mod:`receivewal.commands.verify_call` (its start-up
is most of a small archive's check). Everything else, and any restore or verify command line
those do not take (``--help``, an unknown option, a usage error), goes to the click group in
:mod:`receivewal.commands.group`, which owns the options and their help.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``receivewal`` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    args, config = _config_named(args)
    if config:
        from receivewal.commands.configfile import load_config  # noqa: PLC0415 - only then
        from receivewal.errors import ConfigurationError  # noqa: PLC0415

        try:
            load_config(config, os.environ)
        except ConfigurationError as exc:
            sys.stderr.write(f"receivewal: error: {exc}\n")
            # Never 1: to PostgreSQL a restore call's 1 means "the archive lacks the file"
            # (recovery would end there), and to verify "NOT recoverable". A usage error's 2,
            # and a restore call's 126 (stop recovery), as for its own bad options.
            return 126 if args[:1] == ["restore"] else 2
    if args[:1] == ["restore"]:
        from receivewal.commands import restore_options  # noqa: PLC0415 - the lean path

        call = restore_options.parse(args[1:])
        if call is not None:
            from receivewal.restore.call import run  # noqa: PLC0415

            return run(call)
    elif args[:1] == ["verify"]:
        from receivewal.commands import verify_call  # noqa: PLC0415 - the lean path

        verify = verify_call.parse(args[1:])
        if verify is not None:
            return verify_call.run(verify)
    from receivewal.commands.group import main as click_main  # noqa: PLC0415

    return click_main(args)


def _config_named(args: list[str]) -> tuple[list[str], str]:
    """The command line without a leading ``--config FILE`` (``--config=FILE``), and the
    configuration file it names, else ``RECEIVEWAL_CONFIG``'s (empty: none); a ``--config``
    without its file is left to click to refuse."""
    if args[:1] == ["--config"] and len(args) > 1:
        return args[2:], args[1]
    if args[:1] and args[0].startswith("--config="):
        return args[1:], args[0].removeprefix("--config=")
    return args, os.environ.get("RECEIVEWAL_CONFIG", "")


def __getattr__(name: str) -> Any:
    """The click group's names (``cli``, ``LAZY_COMMANDS``), imported on first use."""
    if name in {"cli", "LAZY_COMMANDS", "LazyGroup"}:
        from receivewal.commands import group  # noqa: PLC0415

        return getattr(group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
