"""Make the committed WAL fixture: two consecutive 1 MiB segments of a real PostgreSQL 15 server.

Run from the repository root: ``.venv/bin/python tests/data/wal/make_fixture.py``. It writes
``<segment>.zst`` for two segments where a record crosses from the first into the second, and
``waldump-stats.txt`` and ``waldump-stats-record.txt``, the output of ``pg_waldump --stats``
and ``--stats=record`` on the same two segments.
"""

from __future__ import annotations

import itertools
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import zstandard

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from support.servers import PgServer, make_shared_dir, pg_bin  # noqa: E402


def main() -> None:
    """Start a server with 1 MiB segments, write varied WAL, keep two segments."""
    base = make_shared_dir("receivewal-fixture-")
    server = PgServer(base, "fixture")
    try:
        server.init(initdb_args=("--wal-segsize=1",))
        server.start()
        server.sql("CREATE TABLE t (id int PRIMARY KEY, pad text)")
        server.sql("INSERT INTO t SELECT g, repeat('y', 100) FROM generate_series(1, 4000) g")
        server.sql("CHECKPOINT")
        server.sql("UPDATE t SET pad = repeat('z', 120) WHERE id % 3 = 0")
        server.sql("DELETE FROM t WHERE id % 7 = 0")
        server.sql("VACUUM t")
        server.sql("INSERT INTO t SELECT g, repeat('w', 300) FROM generate_series(5000, 9000) g")
        current = server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        server.switch_wal()
        names = sorted(p.name for p in server.pg_wal.iterdir()
                       if len(p.name) == 24 and p.name < current)
        pick = None
        for first, second in itertools.pairwise(names):
            info = struct.unpack_from("<H", (server.pg_wal / second).read_bytes(), 2)[0]
            if info & 1 and int(second[16:], 16) == int(first[16:], 16) + 1:
                pick = (first, second)
                break
        if pick is None:
            raise SystemExit("no record crosses a segment boundary; write more WAL")
        with tempfile.TemporaryDirectory() as tmp:
            for name in pick:
                shutil.copy(server.pg_wal / name, Path(tmp) / name)
                data = (server.pg_wal / name).read_bytes()
                packed = zstandard.ZstdCompressor(level=19).compress(data)
                (HERE / f"{name}.zst").write_bytes(packed)
            out = subprocess.run([pg_bin("pg_waldump"), "--stats", "-p", tmp, *pick],
                                 capture_output=True, text=True, check=False)
            (HERE / "waldump-stats.txt").write_text(out.stdout)
            out = subprocess.run([pg_bin("pg_waldump"), "--stats=record", "-p", tmp, *pick],
                                 capture_output=True, text=True, check=False)
            (HERE / "waldump-stats-record.txt").write_text(out.stdout)
        print("fixture:", *pick)
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
