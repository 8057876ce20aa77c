"""structlog configuration: JSON lines off a terminal, readable console output on one."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from receivewal.secrets import redacted


def configure_logging(verbose: int = 0, json: bool | None = None) -> None:
    """Log to stderr; ``verbose`` 0 = info, 1+ = debug. JSON unless stderr is a terminal."""
    level = logging.DEBUG if verbose > 0 else logging.INFO
    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any] = [
        redact_secrets,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def redact_secrets(_logger: object, _method: str, event: Any) -> Any:
    """structlog processor: every text of an event through :func:`~receivewal.secrets.redacted`
    (a path or URL an error quotes may hold a password or a private key an operator gave)."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redacted(value)
        elif isinstance(value, BaseException) and redacted(text := str(value)) != text:
            event[key] = redacted(text)  # else the exception stays as the renderer shows it
    return event


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """A logger on whatever ``sys.stderr`` is now (not the one at configuration time)."""
    return structlog.PrintLogger(sys.stderr)


def get_logger(**context: Any) -> Any:
    """A logger carrying ``context`` on every event.

    It is a lazy proxy: the configuration is looked up when it logs, so a module-level logger
    created at import time still follows :func:`configure_logging` called later.
    """
    return structlog.get_logger(**context)
