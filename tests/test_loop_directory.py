"""The loop with an archive in a directory, plain and sealed (issue 31): a point-in-time
recovery, the same archive going on with the new primary and taking its backup, then
``recover latest`` with every row, and ``verify`` of the two timelines (support.loop)."""

from __future__ import annotations

import pytest
from support.loop import loop_base, remove, run_the_loop

pytestmark = pytest.mark.server


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_the_archive_survives_its_own_recoveries_in_a_directory(sealed: bool) -> None:
    base = loop_base("dir")
    try:
        run_the_loop(base, None, sealed)
    finally:
        remove(base)
