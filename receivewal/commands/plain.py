"""A plain value class for the lean command paths (``verify_call``).

Their command-line objects compare and print by their ``__slots__``, as a frozen dataclass
would, without importing ``dataclasses`` (with ``inspect`` behind it, ~10 ms of a call's
start-up).
"""

from __future__ import annotations


class Plain:
    """Equality and repr by ``__slots__`` (set by the subclass); not hashable."""

    __slots__: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"
