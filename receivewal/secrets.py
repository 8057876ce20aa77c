"""Secrets kept out of log lines, messages, the state file, STATUS and ``ps`` (pure).

One masking rule for every place that may show a connection string, a bucket URL, a path or a
message quoting one: the connection's debug line, the monitor's status and errors, the process
title, and every printer of an error line (the click group's, a restore call's, verify's, the
drop-in's, structlog's). It masks passwords (``password=``, a URI's ``user:pw@``, whatever its
scheme: ``postgresql://``, ``s3://``) and age private keys (``AGE-SECRET-KEY-1...``,
``AGE-PLUGIN-...`` identities) given where a path or a key goes. It lives at the root, beside
errors/logs/addresses, so that none of them loads psycopg to use it, and it is on a restore
call's lean path: ``re`` is imported only for a text that holds one of the markers.
"""

from __future__ import annotations

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from re import Pattern

#: The variable an age identity file's path is also read from (``--identity``: restore, verify,
#: analyze, recover); here, on restore's lean path and below the archive's errors that name it.
IDENTITY_ENV = "RECEIVEWAL_IDENTITY"

#: What a text must hold (lower-cased) for :func:`redacted` to look further.
_MARKERS = ("password", ":/", "age-secret-key-", "age-plugin-")
_patterns: list[tuple[Pattern[str], str]] = []


def _compiled() -> list[tuple[Pattern[str], str]]:
    if not _patterns:
        import re  # noqa: PLC0415 - see the module's docstring

        _patterns.extend([
            (re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE), r"\1****"),
            (re.compile(r"([a-z][a-z0-9+.-]*:/{1,2}[^:/@\s\"']*:)[^@\s]*@", re.IGNORECASE),
             r"\1****@"),
            (re.compile(r"AGE-SECRET-KEY-1[0-9A-Z]*", re.IGNORECASE), "AGE-SECRET-KEY-1****"),
            (re.compile(r"AGE-PLUGIN-[0-9A-Z._+-]*?-1[0-9A-Z]{6,}", re.IGNORECASE),
             "AGE-PLUGIN-****"),
        ])
    return _patterns


def redacted(text: str) -> str:
    """``text`` with every password (``password=``, ``sslpassword=``, a URI's ``user:pw@``)
    and every age private key or plugin identity replaced by ``****``: for connection strings
    and any message that may quote one, or a path or key an operator gave (a URL that became
    a path, ``s3:/KEY:SECRET@...``, too)."""
    lowered = text.lower()
    if not any(marker in lowered for marker in _MARKERS):
        return text
    for pattern, replacement in _compiled():
        text = pattern.sub(replacement, text)
    return text


def is_private_key(text: str) -> bool:
    """Whether ``text``, given where a file's path goes, is an age identity itself (a private
    key, ``AGE-SECRET-KEY-1...``, or a plugin's, ``AGE-PLUGIN-...``; any case; or a file's
    text pasted whole), which no message may show."""
    for line in text.upper().splitlines():
        name = line.strip().rpartition("/")[2]
        if "AGE-SECRET-KEY-1" in line or (name.startswith("AGE-PLUGIN-") and "-1" in name):
            return True
    return False


def key_given_as_file(option: str) -> str:
    """The message refusing a private key given instead of its file, for ``option``; it never
    shows the key."""
    return (f"{option} is an age private key, not the path of an identity file (the key is "
            "not shown): put it in a file only this user reads and give the file's path")
