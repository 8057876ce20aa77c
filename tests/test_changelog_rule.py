"""The change log's uploads and local rule (``logical --upload-to URL --keep-local AGE``)
without a server, against a scripted store written to the bucket's own small interface: a
file the store has not confirmed, or one the slot is not confirmed past, never leaves OUTDIR;
once both hold, every complete file but the newest goes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

from support.streams import wait_for

from receivewal.archive.keeplocal import KeepLocal
from receivewal.archive.objectstore import BucketUrl
from receivewal.daemon.events import EventStream
from receivewal.daemon.state import State, write_state
from receivewal.daemon.uploadpolicy import retry_policy
from receivewal.errors import StoreError
from receivewal.logical.store import file_name
from receivewal.logicalreceiver.changeuploads import ChangeUploader, completed_files, read_uploaded
from receivewal.logs import get_logger

URL = BucketUrl("wal", "changes")
LSNS = (0x1000, 0x2000, 0x3000, 0x4000)


class ScriptedBucket:
    """What the uploader asks of a bucket: its URL, keys, and the create-only put; ``down``
    makes every put fail as an unreachable store does."""

    def __init__(self) -> None:
        self.url = URL
        self.down = True
        self.stored: dict[str, bytes] = {}
        self.tries = 0

    def key(self, name: str) -> str:
        return URL.key(name)

    def put_new(self, name: str, source: Path | bytes) -> bool:
        self.tries += 1
        if self.down:
            raise StoreError("the store is down")
        self.stored[name] = source if isinstance(source, bytes) else source.read_bytes()
        return True


def outdir(tmp_path: Path, confirmed: int) -> Path:
    """Four complete change files completed an hour ago, a partial one, and the state file
    of a daemon whose slot is confirmed to ``confirmed``."""
    out = tmp_path / "out"
    out.mkdir()
    hour_ago = time.time() - 3600
    for lsn in LSNS:
        path = out / file_name(lsn)
        path.write_text(f'{{"op":"header","lsn":{lsn}}}\n')
        os.utime(path, (hour_ago, hour_ago))
    (out / file_name(0x5000, partial=True)).write_text("{}\n")
    now = time.time()
    write_state(out, State(pid=os.getpid(), hostname="h", started_at=now, updated_at=now,
                           receiver="logical", slot="s", slot_restart_lsn=confirmed))
    return out


def uploader(out: Path, bucket: ScriptedBucket) -> ChangeUploader:
    return ChangeUploader(out, cast("Any", bucket), EventStream(), get_logger(),
                          retry_policy({"RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05"}),
                          keep=KeepLocal("1s", seconds=1), mode=0o600, sync=False,
                          environ={"RECEIVEWAL_TEST_LOCAL_INTERVAL": "0.05"})


def test_a_change_file_the_store_has_not_confirmed_stays_then_goes_once_it_has(
        tmp_path: Path) -> None:
    out = outdir(tmp_path, confirmed=0x6000)
    bucket = ScriptedBucket()
    uploads = uploader(out, bucket)
    uploads.begin()
    try:
        wait_for(lambda: bucket.tries >= 3, what="three tries failed")
        assert uploads.status().failing_since is not None
        assert completed_files(out) == [file_name(lsn) for lsn in LSNS]
        assert uploads.pending() == [file_name(lsn) for lsn in LSNS]
        bucket.down = False
        wait_for(lambda: not uploads.pending(), what="the uploads")
        wait_for(lambda: completed_files(out) == [file_name(LSNS[-1])],
                 what="all but the newest gone")
    finally:
        uploads.close()
    assert sorted(bucket.stored) == [file_name(lsn) for lsn in LSNS]
    assert read_uploaded(out, str(URL)) == file_name(LSNS[-1])
    assert (out / file_name(0x5000, partial=True)).exists()


def test_a_change_file_the_slot_is_not_confirmed_past_stays(tmp_path: Path) -> None:
    out = outdir(tmp_path, confirmed=0x2000)  # the first file applied, not the second
    bucket = ScriptedBucket()
    bucket.down = False
    uploads = uploader(out, bucket)
    uploads.begin()
    try:
        wait_for(lambda: not uploads.pending(), what="the uploads")
        wait_for(lambda: file_name(LSNS[0]) not in completed_files(out),
                 what="the applied file gone")
        # the same application judged the others: uploaded, not applied, they stay
        assert completed_files(out) == [file_name(lsn) for lsn in LSNS[1:]]
    finally:
        uploads.close()


def test_with_encryption_nothing_plain_goes_up_or_away(tmp_path: Path) -> None:
    """--encrypt-to: a completed file is plain for a moment before it is sealed; the sealed
    files go up after their recipients files, a plain one is neither uploaded nor removed."""
    out = outdir(tmp_path, confirmed=0x6000)
    for lsn in LSNS:
        plain = out / file_name(lsn)
        plain.rename(out / (plain.name + ".age"))
        (out / (plain.name + ".age.recipients")).write_text("age1example\n")
    (out / file_name(0x2800)).write_text("{}\n")  # not sealed yet
    bucket = ScriptedBucket()
    bucket.down = False
    uploads = ChangeUploader(out, cast("Any", bucket), EventStream(), get_logger(),
                             retry_policy({"RECEIVEWAL_TEST_UPLOAD_RETRY": "0.05"}),
                             keep=KeepLocal("1s", seconds=1), mode=0o600, sealed=True,
                             sync=False, environ={"RECEIVEWAL_TEST_LOCAL_INTERVAL": "0.05"})
    uploads.begin()
    try:
        wait_for(lambda: not uploads.pending(), what="the uploads")
        wait_for(lambda: len(completed_files(out, sealed=True)) == 1, what="the rule")
    finally:
        uploads.close()
    sealed = [file_name(lsn) + ".age" for lsn in LSNS]
    assert sorted(bucket.stored) == sorted([*sealed, *(n + ".recipients" for n in sealed)])
    assert (out / file_name(0x2800)).exists()
    assert sorted(p.name for p in out.glob("*.recipients")) == [sealed[-1] + ".recipients"]
