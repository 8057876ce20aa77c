"""How pytest-xdist shares the suite between its workers (``scripts/test``: ``-n 3 --dist
loadfile``): a module runs in one worker as a whole, as it would alone (its module fixtures,
e.g. a SeaweedFS server, start once), and the modules of one group in WORKER_GROUPS run in the
same worker, one after the other; the tests of a SPLIT_PER_TEST module are units of their own."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from xdist.scheduler import LoadFileScheduling

#: The package test installs the .deb on this machine, whose root file system the namespaced
#: systemd's overlay reads (and both use one build of it, the session fixture ``deb``); the
#: modules that run analyze in this process share one Spark session (``spark``, a JVM, and the
#: S3 server it was started for, ``seaweed_server``). The pair of archives the analyze modules
#: read (``two_archives``) is built once per run for every worker (support.sparkarchives), so
#: the modules that bring their own Spark (a standalone cluster, a Spark Connect server) run
#: alone, on any worker, beside the group.
WORKER_GROUPS = {
    "test_package.py": "deb", "test_systemd_real.py": "deb",
    "test_analyze.py": "spark", "test_analyze_bucket.py": "spark",
    "test_analyze_changes.py": "spark", "test_analyze_asof.py": "spark",
    "test_huge_records.py": "spark",
}
#: Modules whose tests share no module fixture and each take a minute or so: each test is a
#: unit of its own, so that they spread over the workers instead of queueing on one.
SPLIT_PER_TEST = ("test_benchmarks.py",)
#: The longest units of work (minutes, against seconds for most modules), handed out first:
#: a worker that started one of them last would run on alone long after the other finished.
LONGEST_FIRST = ("spark", "tests/test_analyze_cluster.py", "deb",
                 "tests/test_benchmarks.py::test_verify_throughput_bench_runs",
                 "tests/test_analyze_connect.py",
                 "tests/test_benchmarks.py::test_recovery_bench_runs",
                 "tests/test_timelines.py", "tests/test_loop_bucket.py",
                 "tests/test_upload.py",
                 "tests/test_restore_bucket.py", "tests/test_upload_faults.py")


def worker_group(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's group, else the test itself in a
    SPLIT_PER_TEST module (parameters and all), else its module."""
    module = nodeid.split("::", 1)[0]
    name = PurePosixPath(module).name
    if name in SPLIT_PER_TEST:
        return nodeid.split("[", 1)[0]
    return WORKER_GROUPS.get(name, module)


class ModuleGroupScheduling(LoadFileScheduling):  # type: ignore[misc] # xdist has no types
    """xdist's ``loadfile`` scheduling, with the modules of a group as one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        return worker_group(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        """Hand out the units of LONGEST_FIRST first (xdist's queue is ordered by count of
        tests, largest first), then the others in xdist's order."""
        for unit in reversed(LONGEST_FIRST):
            if unit in self.workqueue:
                self.workqueue.move_to_end(unit, last=False)
        super()._assign_work_unit(node)
