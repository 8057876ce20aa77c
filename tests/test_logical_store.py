"""The change log on disk: files named after their first commit, rotated by size, zstd at
rest, and crash safety: a partial file cut anywhere (a kill in the middle of a write), a kill
in the middle of a rotation, or a process SIGKILLed while it writes, resumes with every
transaction exactly once, in commit order."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import logical_wire as w
from support.changelog import Message, consume, file_records, log_files, open_store, read_log, runs

from receivewal.errors import ArchiveError, ConfigurationError
from receivewal.logical.store import StoreSettings, file_name, parse_file_name
from receivewal.wal.lsn import parse_lsn

T0 = 849_000_000_000_000
INT4, TEXT = 23, 25


def workload(count: int = 40, seed: int = 1) -> list[Message]:
    """Transactions of every kind, in one server's order: plain ones, streamed ones
    (interleaved, one aborted, one with an aborted subtransaction), two-phase ones, messages,
    a relation that changes."""
    rng = random.Random(seed)  # noqa: S311 - test data, not cryptography
    out: list[Message] = []
    lsn = 0x1000

    def at(step: int = 0x40) -> int:
        nonlocal lsn
        lsn += step
        return lsn

    relation = w.relation(16384, "public", "items", [(True, "id", INT4, -1),
                                                     (False, "v", TEXT, -1)])
    row_id = 0

    def row() -> list[w.Column]:
        nonlocal row_id
        row_id += 1
        return [("t", b"%d" % row_id), ("t", b"x" * rng.randrange(1, 200))]

    for n in range(count):
        kind = n % 8
        if kind in (0, 1, 2, 3):
            start = at()
            final = start + 0x800
            out += [(start, w.begin(final, T0 + n, 1000 + n)), (0, relation)]
            out += [(start + 8 * (i + 1), w.insert(16384, row()))
                    for i in range(rng.randrange(1, 6))]
            out.append((final + 0x30, w.commit(final, final + 0x30, T0 + n)))
            lsn = final + 0x30
        elif kind == 4:  # two streams interleaved; one aborts a subtransaction
            a, b = 5000 + n, 6000 + n
            out += [(at(), w.stream_start(a, True)), (0, w.relation(16384, "public", "items", [
                (True, "id", INT4, -1), (False, "v", TEXT, -1)], xid=a)),
                    (at(8), w.insert(16384, row(), xid=a)),
                    (at(8), w.insert(16384, row(), xid=a + 1)), (at(8), w.stream_stop()),
                    (at(), w.stream_start(b, True)), (0, w.relation(16384, "public", "items", [
                        (True, "id", INT4, -1), (False, "v", TEXT, -1)], xid=b)),
                    (at(8), w.insert(16384, row(), xid=b)), (at(8), w.stream_stop()),
                    (at(), w.stream_abort(a, a + 1, lsn, T0)),
                    (at(), w.stream_abort(b, b, lsn, T0))]
            end = at()
            out.append((end + 0x30, w.stream_commit(a, end, end + 0x30, T0 + n)))
            lsn = end + 0x30
        elif kind == 5:
            start = at()
            prepare_lsn = start + 0x100
            out += [(start, w.begin_prepare(prepare_lsn, prepare_lsn + 0x30, T0, 7000 + n,
                                            f"g{n}")), (0, relation),
                    (at(8), w.insert(16384, row()))]
            lsn = prepare_lsn + 0x30
            out.append((lsn, w.prepare(prepare_lsn, lsn, T0, 7000 + n, f"g{n}")))
            commit_lsn = at()
            out.append((at(0x30), w.commit_prepared(commit_lsn, lsn, T0, 7000 + n, f"g{n}")))
        elif kind == 6:
            out.append((at(), w.message(lsn, "app", b"note %d" % n, transactional=False)))
        else:
            relation = w.relation(16384, "public", "items", [
                (True, "id", INT4, -1), (False, "v", TEXT, -1 - n)])  # a new description
    return out


WORK = workload()


def reference(tmp_path: Path, **settings: object) -> list[list[dict[str, object]]]:
    """The runs of WORK written in one go."""
    directory = tmp_path / "reference"
    directory.mkdir()
    store = open_store(directory, **settings)
    consume(store, WORK).close()
    store.close()
    return runs(read_log(directory))


def test_files_are_named_after_their_first_commit_and_rotated_by_size(tmp_path: Path) -> None:
    """Each complete file is named after its first run's commit LSN and starts with the
    header and the relation lines its runs need; one partial file; names grow."""
    store = open_store(tmp_path, file_size=1500)
    consume(store, WORK).close()
    store.close()
    files = log_files(tmp_path)
    assert len(files) > 5
    assert [path.name.endswith(".partial") for path in files] == [False] * (len(files) - 1) + [
        True]
    for path in files:
        records = file_records(path)
        assert records[0] == {"op": "header", "format": 1, "plugin": "pgoutput"}
        parsed = parse_file_name(path.name)
        assert parsed is not None
        assert parsed[0] == first_commit_lsn(records)
        described = {(r["schema"], r["table"]) for r in records if r["op"] == "relation"}
        changed = {(r["schema"], r["table"]) for r in records
                   if r["op"] in ("insert", "update", "delete")}
        assert changed <= described
    names = [parse_file_name(path.name)[0] for path in files]  # type: ignore[index]
    assert names == sorted(set(names))
    assert runs(read_log(tmp_path)) == reference(tmp_path)


def first_commit_lsn(records: list[dict[str, object]]) -> int:
    """The LSN a file is named after: its first run's commit (or prepare) LSN; a message's
    LSN, a rollback's end."""
    first = runs(records)[0]
    end = first[-1]
    key = end.get("commit_lsn") or end.get("prepare_lsn") or end.get("rollback_end_lsn") \
        or end["lsn"]
    assert isinstance(key, str)
    return parse_lsn(key)


def test_zstd_at_rest(tmp_path: Path) -> None:
    """With zstd the complete files are .jsonl.zst (the partial one stays plain) and hold
    the same lines."""
    store = open_store(tmp_path, file_size=1500, compression="zstd")
    consume(store, WORK).close()
    store.close()
    names = [path.name for path in log_files(tmp_path)]
    assert all(name.endswith(".jsonl.zst") for name in names[:-1])
    assert names[-1].endswith(".jsonl.partial")
    assert runs(read_log(tmp_path)) == reference(tmp_path)


def test_file_names() -> None:
    """16 capital hex digits of the LSN; names of other files are not the change log's."""
    assert file_name(0x1_6B3748) == "00000000016B3748.jsonl"
    assert file_name(0x1_6B3748, "zstd") == "00000000016B3748.jsonl.zst"
    assert file_name(5, partial=True) == "0000000000000005.jsonl.partial"
    assert parse_file_name("00000000016B3748.jsonl.zst") == (0x16B3748, "zstd", False)
    assert parse_file_name("00000000016B3748.jsonl.zst.partial") is None
    assert parse_file_name("000000010000000000000001") is None
    with pytest.raises(ConfigurationError, match="zstd only"):
        StoreSettings(compression="lz4")


def _cut_states(tmp_path: Path, file_size: int, compression: str) -> list[Path]:
    """Directories as a kill would leave them: WORK fed message by message, the directory
    copied at random moments, its partial file cut at a random byte of what the process
    had written."""
    rng = random.Random(7)  # noqa: S311 - test data, not cryptography
    live = tmp_path / "live"
    live.mkdir()
    store = open_store(live, file_size=file_size, compression=compression)
    consumer = consume(store, [])
    states = []
    for number, (lsn, payload) in enumerate(WORK):
        consumer.receive(lsn, payload)
        if rng.random() < 0.3:
            consumer.flush()
        if rng.random() < 0.15:
            state = tmp_path / f"state{number}"
            shutil.copytree(live, state)
            partial = [p for p in log_files(state) if p.name.endswith(".partial")]
            store._flush_pending()  # what the process had written when it was killed
            for path in partial:
                data = (live / path.name).read_bytes()
                path.write_bytes(data[:rng.randrange(len(data) + 1)])
            states.append(state)
    consumer.close()
    store.close()
    return states


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_a_partial_file_cut_anywhere_resumes_exactly_once(tmp_path: Path,
                                                         compression: str) -> None:
    """A kill at any point of a write: the next start cuts the partial file after its last
    complete run (a file without one goes), reports that run's end as written, and the
    stream sent again from the start (the worst a slot can do) writes every transaction
    exactly once, in commit order, the log as if nothing had happened."""
    expected = reference(tmp_path, file_size=900, compression=compression)
    states = _cut_states(tmp_path, 900, compression)
    assert len(states) >= 15
    for state in states:
        store = open_store(state, file_size=900, compression=compression)
        ends = [r for run in runs(read_log(state)) for r in run[-1:]]
        assert store.written_through == (_end(ends[-1]) if ends else 0)
        consume(store, WORK).close()
        store.close()
        assert runs(read_log(state)) == expected, state.name


def _end(record: dict[str, object]) -> int:
    from receivewal.logical.changelines import run_end  # noqa: PLC0415
    end = run_end(record)
    assert end is not None
    return end


def test_a_kill_inside_a_rotation(tmp_path: Path) -> None:
    """A kill after the compressed copy was written under its temporary name, or after it
    was renamed but before the partial file was removed: the temporary file goes, the
    partial one is used or dropped as the complete file says, nothing is written twice."""
    expected = reference(tmp_path, file_size=1500, compression="zstd")
    done = tmp_path / "done"
    done.mkdir()
    store = open_store(done, file_size=1500, compression="zstd")
    consume(store, WORK).close()
    store.close()
    first = log_files(done)[0]
    plain = b"".join(line + b"\n" for line in _lines(first))
    # renamed, partial not yet removed
    renamed = tmp_path / "renamed"
    shutil.copytree(done, renamed)
    (renamed / first.name.replace(".zst", ".partial")).write_bytes(plain)
    # written under the temporary name, not renamed: the partial is the truth
    pending = tmp_path / "pending"
    shutil.copytree(done, pending)
    (pending / first.name).rename(pending / f".{first.name}.4242.receivewal-tmp")
    (pending / first.name.replace(".zst", ".partial")).write_bytes(plain)
    for path in log_files(pending)[1:]:  # the kill came before anything after it was written
        path.unlink()
    for state in (renamed, pending):
        store = open_store(state, file_size=1500, compression="zstd")
        consume(store, WORK).close()
        store.close()
        assert not [p for p in state.iterdir() if p.name.endswith("receivewal-tmp")]
        assert runs(read_log(state)) == expected, state.name


def _lines(path: Path) -> list[bytes]:
    import zstandard  # noqa: PLC0415
    return zstandard.ZstdDecompressor().decompressobj().decompress(
        path.read_bytes()).splitlines()


def test_damage_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A complete file that does not read to its end, a file of another format, or two
    partial files: the store does not open, and says which file."""
    store = open_store(tmp_path, file_size=1500)
    consume(store, WORK).close()
    store.close()
    files = log_files(tmp_path)
    last_complete = files[-2]
    data = last_complete.read_bytes()
    last_complete.write_bytes(data[:-10])
    with pytest.raises(ArchiveError, match=f"{last_complete.name} is damaged"):
        open_store(tmp_path)
    last_complete.write_bytes(data.replace(b'"format":1', b'"format":2', 1))
    with pytest.raises(ArchiveError, match="format 2, not 1"):
        open_store(tmp_path)
    last_complete.write_bytes(data)
    zstd = tmp_path / last_complete.name.replace(".jsonl", ".jsonl.zst")
    last_complete.rename(zstd)
    with pytest.raises(ArchiveError, match=f"{zstd.name} is damaged: zstd data is damaged"):
        open_store(tmp_path)
    zstd.rename(last_complete)
    (tmp_path / file_name(1, partial=True)).write_bytes(files[-1].read_bytes())
    with pytest.raises(ArchiveError, match="more than one partial"):
        open_store(tmp_path)


def test_a_partial_file_without_a_complete_run_goes(tmp_path: Path) -> None:
    """A partial file holding only its header and relation lines (killed before its first
    run ended) is removed, and the file started again is named after its first commit."""
    store = open_store(tmp_path)
    consume(store, WORK[:3]).close()  # begin, relation, insert: no commit yet
    store.close()
    assert log_files(tmp_path) == []
    path = tmp_path / file_name(0x1840, partial=True)  # WORK's first commit LSN
    path.write_bytes(b'{"op":"header","format":1}\n{"op":"relation","lsn":"0/0","schema":"s",'
                     b'"table":"t","columns":[]}\n{"op":"begin","lsn":"0/1",')
    store = open_store(tmp_path)
    assert not path.exists()
    assert store.written_through == 0
    consume(store, WORK).close()
    store.close()
    assert log_files(tmp_path)[0].name == file_name(first_commit_lsn(read_log(tmp_path)),
                                                    partial=True)


WRITER = """
import pickle, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from support.changelog import consume, open_store
messages = pickle.loads(Path(sys.argv[2]).read_bytes())
store = open_store(Path(sys.argv[1]), file_size=2000, compression="zstd")
consumer = consume(store, [])
print("ready", flush=True)
for number, (lsn, payload) in enumerate(messages):
    time.sleep(0.001)  # a slot's pace: a whole run (skipping what is written) outlasts a kill
    consumer.receive(lsn, payload)
    if number % 5 == 0:
        consumer.flush()
consumer.flush()
print("done", flush=True)
"""


def test_a_writer_sigkilled_again_and_again_writes_each_transaction_once(
        tmp_path: Path) -> None:
    """A process feeding the whole stream (as a slot sends it again from its start) is
    SIGKILLed at random moments, 12 times, and started again on the same directory: in the
    end every transaction is in the log exactly once, in commit order."""
    stream = tmp_path / "stream.pickle"
    messages = workload(count=600, seed=3)
    stream.write_bytes(pickle.dumps(messages))
    expected = reference_of(tmp_path, messages)
    directory = tmp_path / "log"
    directory.mkdir()
    rng = random.Random(11)  # noqa: S311 - test data, not cryptography
    tests = str(Path(__file__).parent)
    kills = 0
    while True:
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(stream),
                                  tests], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        if kills < 12:
            time.sleep(rng.uniform(0.01, 0.2))
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                kills += 1
                continue
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        assert out.strip() == "done"
        break
    assert kills == 12
    assert runs(read_log(directory)) == expected


def reference_of(tmp_path: Path, messages: list[Message]) -> list[list[dict[str, object]]]:
    directory = tmp_path / "reference-of"
    directory.mkdir()
    store = open_store(directory, file_size=2000, compression="zstd")
    consume(store, messages).close()
    store.close()
    return runs(read_log(directory))


def test_a_damaged_line_followed_by_records_is_corruption_not_a_torn_tail(
        tmp_path: Path) -> None:
    """One line in the middle of the partial file damaged: the store does not open, naming
    the file, the line and the LSNs on both sides, and changes nothing (cutting there would
    lose every later run the slot had already confirmed). Damage with nothing readable after
    it (a torn tail, zeros and all) is cut as before."""
    store = open_store(tmp_path)
    consume(store, WORK).close()
    store.close()
    (partial,) = log_files(tmp_path)
    lines = partial.read_bytes().splitlines(keepends=True)
    ends = [n for n, line in enumerate(lines) if b'"op":"commit"' in line]
    middle = ends[len(ends) // 2]
    whole_through = json.loads(lines[middle])["end_lsn"]
    damaged = b"".join([*lines[:middle + 1], b'{"op":"insert","lsn":"0/1\x00\n',
                        *lines[middle + 2:]])
    partial.write_bytes(damaged)
    with pytest.raises(ArchiveError) as refused:
        open_store(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{partial} is damaged: line {middle + 2} (at byte ")
    assert f"change log records follow it (from line {middle + 3}, up to " in message
    assert f"the file is whole through {whole_through})" in message
    assert "not a torn tail" in message
    assert partial.read_bytes() == damaged
    # a whole line out of place (a commit outside a run) is no torn tail either, even last
    out_of_place = b"".join([*lines[:middle + 1], lines[ends[-1]]])
    partial.write_bytes(out_of_place)
    with pytest.raises(ArchiveError, match=rf"line {middle + 2} .* is out of place .* it is a "
                                           "whole line, not a torn tail"):
        open_store(tmp_path)
    assert partial.read_bytes() == out_of_place
    # what a crash leaves after the last whole line: garbage, zeros, a cut line
    torn = b"".join([*lines[:middle + 1], b"\x00" * 300, b"\n\xff\xfe\n", lines[middle + 1][:9]])
    partial.write_bytes(torn)
    store = open_store(tmp_path)
    assert store.written_through == parse_lsn(whole_through)
    store.close()
    assert partial.read_bytes() == b"".join(lines[:middle + 1])


def test_analyzes_reader_refuses_the_same_damage_in_a_partial_file(tmp_path: Path) -> None:
    """``analyze --changes`` reads a ``.partial`` up to its last complete run through
    :func:`receivewal.check.changes.file_lines`: a damaged line followed by records is an
    error naming the line there too (Spark's end-to-end case: tests/test_analyze_changes.py)."""
    from receivewal.check.changes import file_lines  # noqa: PLC0415 - analyze's reader

    store = open_store(tmp_path)
    consume(store, WORK[:40]).close()
    store.close()
    (partial,) = log_files(tmp_path)
    row = {"base": str(tmp_path), "file": partial.name, "compression": "", "partial": True}
    whole = list(file_lines(row))
    lines = partial.read_bytes().splitlines(keepends=True)
    assert whole == [line.rstrip(b"\n") for line in lines]
    partial.write_bytes(b"".join([*lines[:3], b"garbage\n", *lines[4:]]))
    with pytest.raises(ArchiveError, match=r"^line 4 \(at byte \d+\) is not a change log "
                                           r"record; change log records follow it"):
        list(file_lines(row))
    partial.write_bytes(b"".join([*lines[:-1], b"garbage\n", lines[-1][:5]]))  # a torn tail
    assert list(file_lines(row))[-1] != b"garbage"
