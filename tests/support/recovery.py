"""The primary of a point-in-time recovery test: a base backup, then rows and WAL after it."""

from __future__ import annotations

from support.servers import PgServer


def backup_then_rows(pg: PgServer, name: str, segments: int) -> tuple[PgServer, str]:
    """Take a base backup of ``pg`` (a new, stopped server named ``name``), then write a
    table of 20,000 rows and about ``segments`` segments of WAL on ``pg``, switch WAL and stop
    it: its pg_wal then holds every segment the backup needs to reach those rows. Returns the
    backup and the rows' ``count(*), sum(id)`` that the recovered server must show."""
    backup = pg.base_backup(name)
    pg.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.sql("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    pg.generate_wal(segments)
    expected = pg.sql("SELECT count(*), sum(id) FROM t")
    pg.switch_wal()
    pg.stop()
    return backup, expected
