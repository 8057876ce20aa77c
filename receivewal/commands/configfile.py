"""An instance's configuration file: the environment's names, one ``NAME=value`` a line, as a
systemd EnvironmentFile holds them (``RECEIVEWAL_DIRECTORY=/var/lib/receivewal/db1``,
``PGHOST=db1``), for those who run receivewal without systemd.

``receivewal --config FILE COMMAND ...`` (or ``RECEIVEWAL_CONFIG=FILE``) reads it before the
command's options: each variable it sets that the environment does not is put into the
environment, where the options read their ``RECEIVEWAL_*`` variables (and libpq its ``PG*``)
from. So an option on the command line wins over the file, and so does a variable already set.
Blank lines and lines starting with ``#`` or ``;`` are comments; a value may be quoted
(``"..."`` or ``'...'``, the quotes removed). A line that is not ``NAME=value`` is refused
naming the file and line, never its text: it may hold a password.

No click and no ``typing``: the console script reads a ``RECEIVEWAL_CONFIG`` file before a
restore call's lean path (see :mod:`receivewal.restore`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from collections.abc import MutableMapping

#: The variable that names the file when ``--config`` does not.
CONFIG_ENV = "RECEIVEWAL_CONFIG"

_NAME_START = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_CHARS = _NAME_START + "0123456789"


def read_config(path: str) -> dict[str, str]:
    """The variables the file at ``path`` sets, in its order (the last of a repeated name
    wins); ConfigurationError naming ``path:line`` for a line that is not ``NAME=value``, or
    the file when it cannot be read."""
    from receivewal.errors import ConfigurationError  # noqa: PLC0415 - only with a file

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigurationError(f"cannot read the configuration file {path}: {reason}") from None
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        name, equals, value = line.partition("=")
        name, value = name.strip(), value.strip()
        problem = _problem(name, equals, value)
        if problem:
            raise ConfigurationError(f"{path}:{number}: {problem}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        found[name] = value
    return found


def _problem(name: str, equals: str, value: str) -> str:
    """Why a line is not ``NAME=value`` (empty: it is); never quoting the line."""
    if not equals:
        return "not NAME=value (a line is a variable, a comment (#) or blank)"
    if not name or name[0] not in _NAME_START or any(c not in _NAME_CHARS for c in name):
        return "the name before = is not a variable name (letters, digits and _)"
    if value[:1] in ("\"", "'") and (len(value) < 2 or value[-1] != value[0]):
        return "a quoted value does not end with its quote"
    return ""


def load_config(path: str, environ: MutableMapping[str, str]) -> None:
    """Put each variable of the file at ``path`` that ``environ`` lacks into it (a variable
    already set wins); ConfigurationError as :func:`read_config`."""
    for name, value in read_config(path).items():
        environ.setdefault(name, value)
