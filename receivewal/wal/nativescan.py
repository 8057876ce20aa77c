"""Which scanner runs: the compiled hot loop (``receivewal.wal._scan``) or pure Python.

The C extension is optional: ``pip install`` builds it where a compiler is present, and the
pure-Python scanner in :mod:`receivewal.wal.reader` gives the same results without it.
``RECEIVEWAL_PURE_PYTHON=1`` forces the pure-Python path (the tests run both), for the
scanner and for the receive loop (:mod:`receivewal.replication.nativerecv`) alike.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType


def pure_python_forced() -> bool:
    """Whether ``RECEIVEWAL_PURE_PYTHON`` (set, and not 0) turns every compiled path off."""
    return os.environ.get("RECEIVEWAL_PURE_PYTHON", "") not in ("", "0")


def load_native(name: str = "receivewal.wal._scan") -> ModuleType | None:
    """The compiled module ``name``, or None when it is not built."""
    try:
        return importlib.import_module(name)  # optional, built at install
    except ImportError:
        return None


native = None if pure_python_forced() else load_native()


def scanner_path() -> str:
    """``"c (crc32c: sse4.2)"``, ``"c (crc32c: software)"`` or ``"python"``."""
    if native is None:
        return "python"
    return f"c (crc32c: {native.crc32c_impl()})"


def crc32c_function() -> Callable[..., int]:
    """CRC-32C (of data, continuing a value): the C extension's when it is built, so that the
    crc32c package (whose import costs verify's start-up ~12 ms: it reads its own version
    through importlib.metadata) is loaded only by the pure-Python path."""
    if native is not None:
        return native.crc32c  # type: ignore[no-any-return]  # (data, value=0), as crc32c.crc32c
    from crc32c import crc32c  # noqa: PLC0415

    return crc32c
