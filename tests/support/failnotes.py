"""What a failing test's report shows beside its traceback: a fixture registers a note (a title
and a function that reads it, e.g. a systemd unit's journal), and tests/conftest.py's
``pytest_runtest_makereport`` adds each note's text as a section of a failed report. The note
is read only when the test failed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

NOTES = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


def on_failure(item: pytest.Item, title: str, read: Callable[[], str]) -> None:
    """Show ``read()`` under ``title`` in the report of ``item`` if it fails."""
    item.stash.setdefault(NOTES, []).append((title, read))


def sections(item: pytest.Item) -> list[tuple[str, str]]:
    """The notes of ``item``, read now; a note that cannot be read says why."""
    found = []
    for title, read in item.stash.get(NOTES, []):
        try:
            text = read()
        except Exception as exc:  # noqa: BLE001 - a note must not hide the failure itself
            text = f"(could not be read: {exc!r})"
        found.append((title, text))
    return found
