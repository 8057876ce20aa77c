"""Which scanner runs: the compiled hot loop (``receivewal.wal._scan``) or pure Python.

The C extension is optional: ``pip install`` builds it where a compiler is present, and the
pure-Python scanner in :mod:`receivewal.wal.reader` gives the same results without it.
``RECEIVEWAL_PURE_PYTHON=1`` forces the pure-Python path (the tests run both).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_native() -> ModuleType | None:
    """The compiled module, or None when it is not built."""
    try:
        return importlib.import_module("receivewal.wal._scan")  # optional, built at install
    except ImportError:
        return None


native = (None if os.environ.get("RECEIVEWAL_PURE_PYTHON", "") not in ("", "0")
          else load_native())


def scanner_path() -> str:
    """``"c (crc32c: sse4.2)"``, ``"c (crc32c: software)"`` or ``"python"``."""
    if native is None:
        return "python"
    return f"c (crc32c: {native.crc32c_impl()})"
