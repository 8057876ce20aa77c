"""The loop with an archive in a bucket (SeaweedFS), plain and sealed (issue 31): the daemon
uploads, backups go to the bucket, and both recoveries and ``verify`` read the bucket alone
(support.loop)."""

from __future__ import annotations

import pytest
from support.loop import loop_base, remove, run_the_loop
from support.seaweed import SeaweedS3

pytestmark = pytest.mark.server


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_the_archive_survives_its_own_recoveries_in_a_bucket(seaweed: SeaweedS3,
                                                             sealed: bool) -> None:
    base = loop_base("bucket")
    try:
        run_the_loop(base, seaweed, sealed)
    finally:
        remove(base)
