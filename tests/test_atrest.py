"""Compression at rest (-Z): pg_receivewal's option grammar, the codecs, the archive scan, and
real servers: archives decode to the server's bytes, SIGKILL loses nothing, and pg_receivewal 15
itself resumes from our compressed files."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.archives import (
    SEGMENT,
    SUFFIX,
    assert_consecutive,
    assert_decompresses_to_server,
    assert_partial_is_prefix,
    complete_files,
    decoded,
    partial_files,
    proven_segment,
    segno,
)
from support.dropin import PG_RECEIVEWAL
from support.servers import PgServer
from support.streams import lsn_to_int, receivewal, start_receivewal, wait_for

from receivewal.archive.compression import (
    CompressSpec,
    CorruptFile,
    decompress_chunks,
    decompressed_size,
    new_compressor,
    parse_compress_option,
)
from receivewal.archive.directory import Archive
from receivewal.archive.layout import resume_order
from receivewal.errors import ConfigurationError
from receivewal.wal.names import SegmentFile

METHODS = ["gzip", "lz4", "zstd"]

# -- the option, as pg_receivewal 15 parses it ------------------------------------------------
SPECS = [
    "0", "5", "10", "-1", " 3", "3 ", "3x", "", "none", "none:0", "none:1", "none:level=0",
    "none:foo", "gzip", "gzip:0", "gzip:-1", "gzip:9", "gzip:10", "gzip:level=3", "gzip:level",
    "gzip:level=", "gzip:level=x", "gzip:level=3x", "gzip:3x", "gzip:", "gzip:level=3,",
    "gzip:,level=3", "gzip:workers=2", "gzip:level=3,workers=2", "gzip:long", "GZIP", "foo",
    "foo:1", "lz4", "lz4:0", "lz4:-1", "lz4:12", "lz4:13", "lz4:level=2,level=3",
    "lz4:level=3 ",
]


def pg_receivewal_verdict(spec: str) -> str | None:
    """pg_receivewal 15's error for ``-Z spec``, or None when it accepts it (and connects)."""
    done = subprocess.run([PG_RECEIVEWAL, "-D", "/", "-Z", spec, "-d", "host=/nonexistent"],
                          capture_output=True, text=True, check=False)
    first = done.stderr.splitlines()[0]
    assert first.startswith("pg_receivewal: error: "), done.stderr
    message = first.removeprefix("pg_receivewal: error: ")
    return None if message.startswith("connection to server") else message


@pytest.mark.parametrize("spec", SPECS)
def test_compress_option_gets_pg_receivewal_15s_verdict(spec: str) -> None:
    """-Z is accepted or refused exactly as pg_receivewal 15 does, with its message."""
    expected = pg_receivewal_verdict(spec)
    if expected is None:
        parse_compress_option(spec)
    else:
        with pytest.raises(ConfigurationError, match=f"^{re.escape(expected)}$"):
            parse_compress_option(spec)


@pytest.mark.parametrize(("spec", "parsed"), [
    ("0", CompressSpec()), ("none", CompressSpec()), ("", CompressSpec()),
    ("5", CompressSpec("gzip", 5)), ("gzip", CompressSpec("gzip")),
    ("gzip:-1", CompressSpec("gzip")), ("lz4:level=9", CompressSpec("lz4", 9)),
    ("lz4:0", CompressSpec("lz4")), ("zstd", CompressSpec("zstd")),
    ("zstd:3", CompressSpec("zstd")), ("zstd:level=19,workers=2", CompressSpec("zstd", 19, 2)),
    ("zstd:-5", CompressSpec("zstd", -5)),
])
def test_compress_option_meaning(spec: str, parsed: CompressSpec) -> None:
    """A bare number is a gzip level and 0 means none; a method's default level is no level."""
    assert parse_compress_option(spec) == parsed


def test_zstd_levels_are_checked_as_postgresql_checks_them() -> None:
    """pg_receivewal 15 refuses zstd; we take it, with PostgreSQL's zstd level range."""
    assert pg_receivewal_verdict("zstd") == "compression with ZSTD is not yet supported"
    with pytest.raises(ConfigurationError, match=r'"zstd" expects a compression level between '
                       r"-131072 and 22 \(default at 3\)"):
        parse_compress_option("zstd:23")


# -- codecs ------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(method=st.sampled_from(METHODS),
       pieces=st.lists(st.tuples(st.binary(max_size=3000), st.booleans()), max_size=12),
       level=st.sampled_from([None, 1]))
def test_compressed_stream_round_trips_and_decodes_up_to_each_flush(
        method: str, pieces: list[tuple[bytes, bool]], level: int | None) -> None:
    """Whatever is fed decodes back; cutting the file after a flush loses nothing flushed."""
    compressor = new_compressor(CompressSpec(method, level))
    out = compressor.begin()
    fed = b""
    for data, flush in pieces:
        out += compressor.compress(data)
        fed += data
        if flush:
            out += compressor.flush()
            cut = b"".join(decompress_chunks(io.BytesIO(out), method, truncated_ok=True))
            assert cut == fed
    out += compressor.finish()
    assert b"".join(decompress_chunks(io.BytesIO(out), method)) == fed
    assert decompressed_size(io.BytesIO(out), method) == len(fed)


@pytest.mark.parametrize("method", METHODS)
def test_unfinished_or_damaged_file_is_refused(method: str) -> None:
    """A file without its end, or with garbage, raises CorruptFile (never another error)."""
    compressor = new_compressor(CompressSpec(method))
    body = compressor.begin() + compressor.compress(os.urandom(5000) * 20) + compressor.flush()
    with pytest.raises(CorruptFile, match="ends before"):
        decompressed_size(io.BytesIO(body), method)
    damaged = body[:40] + bytes(b ^ 0x5A for b in body[40:200]) + body[200:]
    with pytest.raises(CorruptFile):
        decompressed_size(io.BytesIO(damaged + compressor.finish()), method)


def test_gzip_files_are_what_gzip_module_and_tool_read() -> None:
    """Our .gz is a plain gzip member: Python's gzip module and gzip -t accept it."""
    compressor = new_compressor(CompressSpec("gzip", 3))
    data = os.urandom(1000) * 50
    body = compressor.begin() + compressor.compress(data) + compressor.flush() + \
        compressor.compress(data) + compressor.finish()
    assert gzip.decompress(body) == data * 2
    assert subprocess.run(["gzip", "-t"], input=body, check=False).returncode == 0


# -- the start-position scan -------------------------------------------------------------------


def _write(directory: Path, name: str, method: str, data: bytes, *, finish: bool = True) -> None:
    compressor = new_compressor(CompressSpec(method))
    body = compressor.begin() + compressor.compress(data) + compressor.flush()
    (directory / name).write_bytes(body + (compressor.finish() if finish else b""))


def test_scan_recognises_every_compressed_form_and_checks_complete_files(tmp_path: Path) -> None:
    """.gz/.lz4/.zst and their .partial forms are found; a complete file must decode to a
    whole segment, a .partial may hold nothing yet (it is restreamed)."""
    short = bytes(1000)
    _write(tmp_path, "000000010000000000000001.gz", "gzip", proven_segment(1))
    _write(tmp_path, "000000010000000000000002.lz4", "lz4", proven_segment(2))
    _write(tmp_path, "000000010000000000000003.zst", "zstd", proven_segment(3))
    _write(tmp_path, "000000010000000000000004.lz4", "lz4", short)      # too short
    _write(tmp_path, "000000010000000000000005.zst", "zstd", proven_segment(5),
           finish=False)  # no end
    _write(tmp_path, "000000010000000000000006.gz", "gzip", short)     # trailer says 1000
    archive = Archive(tmp_path)
    newest, rejected = archive.resume_point(SEGMENT)
    assert newest == SegmentFile(3, 1, "zstd")  # the damaged newer ones are passed over
    assert [r.file for r in rejected] == [
        "000000010000000000000006.gz", "000000010000000000000005.zst",
        "000000010000000000000004.lz4",
    ]
    _write(tmp_path, "000000010000000000000007.zst.partial", "zstd", short, finish=False)
    _write(tmp_path, "000000010000000000000008.lz4.partial", "lz4", short, finish=False)
    (tmp_path / "000000010000000000000009.gz.partial").write_bytes(b"")
    assert len(archive.segment_names(SEGMENT)) == 9
    newest, rejected = archive.resume_point(SEGMENT)
    assert newest == SegmentFile(9, 1, "gzip", partial=True)  # a .partial is restreamed
    assert rejected == []
    assert max(archive.segment_names(SEGMENT), key=resume_order) == newest


# -- against real servers ----------------------------------------------------------------------
def events(stderr: str) -> list[dict[str, object]]:
    """receivewal's JSON log lines."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.shared_server
@pytest.mark.server
@pytest.mark.parametrize("method", METHODS)
def test_compressed_archive_decodes_to_the_servers_segments(
        method: str, pg: PgServer, archive_dir: Path) -> None:
    """-Z METHOD: every complete file is <name><suffix>, decodes to the server's segment, the
    last is <name><suffix>.partial holding the server's bytes up to endpos; a second run goes
    on after the compressed files."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.generate_wal(3)
    endpos = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-Z", method, "-E", endpos, "-n")
    assert done.returncode == 0, done.stderr
    names = assert_decompresses_to_server(archive_dir, pg, SUFFIX[method])
    assert len(names) >= 3
    assert_consecutive(names)
    (partial,) = partial_files(archive_dir)
    assert partial.endswith(SUFFIX[method] + ".partial")
    assert segno(partial) == segno(names[-1]) + 1
    assert_partial_is_prefix(archive_dir, pg, partial, at_least=lsn_to_int(endpos) % SEGMENT)
    # every complete file is much smaller than a segment
    assert all((archive_dir / n).stat().st_size < SEGMENT // 2 for n in names)

    pg.generate_wal(1)
    endpos2 = pg.mid_segment_lsn()
    again = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                       "-Z", method, "-E", endpos2, "-n")
    assert again.returncode == 0, again.stderr
    started = next(e for e in events(again.stderr) if e["event"] == "streaming_started")
    seg = segno(partial)
    assert lsn_to_int(str(started["start_lsn"])) == seg * SEGMENT  # the .partial, restreamed
    names2 = assert_decompresses_to_server(archive_dir, pg, SUFFIX[method])
    assert_consecutive(names2)
    assert names2[: len(names)] == names
    assert len(names2) > len(names)
    assert len(partial_files(archive_dir)) == 1


@pytest.mark.shared_server
@pytest.mark.server
@pytest.mark.parametrize("method", METHODS)
def test_sigkill_in_the_middle_of_a_compressed_segment_loses_nothing(
        method: str, pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """SIGKILL while a compressed .partial is half written: what was reported flushed decodes
    from the file, and a restart restreams the segment and ends byte-identical, no gap."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    log = tmp_path / "receivewal.log"
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                            "-Z", method, "-s", "0.2", stderr_path=log)
    try:
        pg.generate_wal(1)
        pg.mid_segment_lsn()
        pg.sql("INSERT INTO tail SELECT generate_series(1, 20000)")
        target = lsn_to_int(pg.current_lsn())

        def flushed() -> int:
            text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
            return lsn_to_int(text) if text else 0
        wait_for(lambda: flushed() >= target, what="the server to see our flush")
        reported = flushed()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    (partial,) = partial_files(archive_dir)
    assert partial.endswith(SUFFIX[method] + ".partial")
    assert segno(partial) == reported // SEGMENT
    # everything reported as flushed is in the file (the compressor was flushed, then fsync)
    assert_partial_is_prefix(archive_dir, pg, partial, at_least=reported % SEGMENT)
    restart = lsn_to_int(pg.sql("SELECT restart_lsn FROM pg_replication_slots"))
    assert restart <= reported

    pg.generate_wal(2)
    endpos = pg.mid_segment_lsn()
    done = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-Z", method, "-E", endpos, "-n")
    assert done.returncode == 0, done.stderr + log.read_text()
    names = assert_decompresses_to_server(archive_dir, pg, SUFFIX[method])
    assert_consecutive(names)
    assert partial.removesuffix(".partial") in names  # the killed segment, now complete


def pg_receivewal_15(*args: str) -> subprocess.CompletedProcess[str]:
    """Run PostgreSQL's own pg_receivewal 15."""
    return subprocess.run([PG_RECEIVEWAL, *args], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.shared_server
@pytest.mark.server
@pytest.mark.parametrize("method", ["gzip", "lz4"])
def test_pg_receivewal_15_resumes_from_our_compressed_files(
        method: str, pg: PgServer, archive_dir: Path) -> None:
    """pg_receivewal 15 run on our archive takes our .gz/.lz4 files (complete and .partial):
    it starts at our .partial's segment, then after our complete files, without an error,
    and what it writes with ours decodes to the server's segments."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.generate_wal(2)
    endpos = pg.mid_segment_lsn()
    ours = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                      "-Z", method, "-E", endpos, "-n")
    assert ours.returncode == 0, ours.stderr
    (partial,) = partial_files(archive_dir)
    last_ours = complete_files(archive_dir)[-1]

    pg.generate_wal(1)
    endpos2 = pg.endpos_inside_the_wal()
    theirs = pg_receivewal_15("-D", str(archive_dir), "-d", pg.dsn, "-S", "arch", "-Z", method,
                              "-E", endpos2, "-n", "-v")
    assert theirs.returncode == 0, theirs.stderr
    assert "error" not in theirs.stderr, theirs.stderr
    assert "warning" not in theirs.stderr, theirs.stderr
    started = re.search(r"starting log streaming at ([0-9A-F]+/[0-9A-F]+) \(timeline 1\)",
                        theirs.stderr)
    assert started, theirs.stderr
    assert lsn_to_int(started.group(1)) == segno(partial) * SEGMENT
    # now without a .partial of ours in the way: it must start right after our last file
    names = assert_decompresses_to_server(archive_dir, pg, SUFFIX[method])
    assert_consecutive(names)
    assert segno(names[-1]) > segno(last_ours)
    for name in partial_files(archive_dir):
        os.unlink(archive_dir / name)
    ours2 = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                       "-Z", method, "-E", pg.switch_wal(), "-n")
    assert ours2.returncode == 0, ours2.stderr
    last = complete_files(archive_dir)[-1]
    for name in partial_files(archive_dir):
        os.unlink(archive_dir / name)
    pg.generate_wal(1)
    theirs2 = pg_receivewal_15("-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                               "-Z", method, "-E", pg.endpos_inside_the_wal(), "-n", "-v")
    assert theirs2.returncode == 0, theirs2.stderr
    started = re.search(r"starting log streaming at ([0-9A-F]+/[0-9A-F]+)", theirs2.stderr)
    assert started, theirs2.stderr
    assert lsn_to_int(started.group(1)) == (segno(last) + 1) * SEGMENT
    assert_consecutive(assert_decompresses_to_server(archive_dir, pg, SUFFIX[method]))


@pytest.mark.shared_server
@pytest.mark.server
def test_flush_reported_with_compression_is_durable_in_the_file(
        pg: PgServer, archive_dir: Path, tmp_path: Path) -> None:
    """--synchronous with -Z lz4: at any moment the file decodes at least to the position the
    server shows as flushed."""
    proc = start_receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "--synchronous",
                            "-Z", "lz4", "-s", "0.1", stderr_path=tmp_path / "log")
    try:
        wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication") == "1",
                 what="replication connection")
        pg.sql("CREATE TABLE t (x int, pad text)")
        for _ in range(8):
            pg.sql("INSERT INTO t SELECT g, repeat('z', 100) FROM generate_series(1, 3000) g")
            time.sleep(0.2)
            text = pg.sql("SELECT flush_lsn FROM pg_stat_replication")
            if not text:
                continue
            flushed = lsn_to_int(text)
            name = f"00000001{flushed // SEGMENT // 256:08X}{flushed // SEGMENT % 256:08X}"
            if flushed % SEGMENT == 0:
                continue
            try:
                held = len(decoded(archive_dir / (name + ".lz4.partial"), truncated_ok=True))
            except FileNotFoundError:  # completed in the meantime
                held = len(decoded(archive_dir / (name + ".lz4")))
            assert held >= flushed % SEGMENT
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.mark.shared_server
@pytest.mark.server
def test_changing_method_leaves_one_form_perproven_segment(pg: PgServer, archive_dir: Path) -> None:
    """A .gz.partial left by a -Z gzip run is restreamed as .lz4 by a -Z lz4 run, and removed
    once the .lz4 is complete: never two forms of a segment, never a stale .partial."""
    pg.sql("SELECT pg_create_physical_replication_slot('arch', true)")
    pg.generate_wal(1)
    first = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                       "-Z", "gzip", "-E", pg.mid_segment_lsn(), "-n")
    assert first.returncode == 0, first.stderr
    (gz_partial,) = partial_files(archive_dir)
    assert gz_partial.endswith(".gz.partial")
    pg.generate_wal(1)
    second = receivewal("stream", "-D", str(archive_dir), "-d", pg.dsn, "-S", "arch",
                        "-Z", "lz4", "-E", pg.mid_segment_lsn(), "-n")
    assert second.returncode == 0, second.stderr
    names = complete_files(archive_dir)
    assert gz_partial.replace(".gz.partial", ".lz4") in names
    assert not (archive_dir / gz_partial).exists()
    (lz4_partial,) = partial_files(archive_dir)
    assert lz4_partial.endswith(".lz4.partial")
    assert len({n[:24] for n in names}) == len(names)
