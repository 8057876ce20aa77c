"""Passwords kept out of log lines, the state file, STATUS and ``ps`` (pure).

One masking rule for every place that may show a connection string or a message quoting one:
the connection's debug line, the monitor's status and errors, the process title. It lives at
the root, beside errors/logs/addresses, so that none of them loads psycopg to use it.
"""

from __future__ import annotations

import re

_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD_RE = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)


def redacted(text: str) -> str:
    """``text`` with every password (``password=``, ``sslpassword=``, a URI's ``user:pw@``)
    replaced by ``****``: for connection strings and any message that may quote one."""
    return _URI_PASSWORD_RE.sub(r"\1****@", _PASSWORD_RE.sub(r"\1****", text))
