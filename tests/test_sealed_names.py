"""One object per sealed file (issue 34 §2): a sealed file's name carries the fingerprint of
the recipient set it is sealed to (``NAME[.zst].FINGERPRINT.age``), read unambiguously by the
full name parser and by restore's lean one; the older form (``NAME[.zst].age`` beside its
recipients file) still reads."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import zstandard
from support.agekeys import new_identity_file
from support.streams import receivewal_here

from receivewal.archive import agestream, sealed
from receivewal.archive.identity import IDENTITY_FILE, ArchiveIdentity, identity_to_json
from receivewal.archive.recipients import (
    AdoptedSet,
    NotARecipient,
    RecipientSet,
    recipient_set,
    recipients_file_text,
)
from receivewal.restore.absence import surely_absent
from receivewal.restore.local import restore_file
from receivewal.wal.leannames import (
    is_stored_suffix,
    next_held_after,
    sealed_suffix,
    split_sealed,
)
from receivewal.wal.names import (
    AtRest,
    encrypted_file_name,
    is_other_wal_file_name,
    is_wal_file_name,
    parse_archive_segment_name,
    parse_encrypted_segment_name,
    parse_segment_file_name,
    unsealed_name,
)

ALICE = "age13ns52ut46ly7t6vlwcwymusuf3qsauvkt7lxz2mp3smh9c3629fsrac08k"
SEGMENT = 16 << 20
FINGERPRINT = recipient_set([ALICE]).fingerprint


@pytest.mark.parametrize("fmt", list(AtRest))
def test_a_sealed_segment_is_named_after_its_at_rest_form_its_set_and_age(fmt: AtRest) -> None:
    plain = "000000010000000A00000004" + fmt.suffix
    name = encrypted_file_name(plain, FINGERPRINT)
    assert name == f"{plain}.{FINGERPRINT}.age"
    segment = parse_encrypted_segment_name(name, SEGMENT)
    assert segment is not None
    assert (segment.compression, segment.encrypted, segment.fingerprint) == \
        (fmt, True, FINGERPRINT)
    assert segment.file_name(SEGMENT) == name
    assert parse_archive_segment_name(name, SEGMENT) == segment
    assert split_sealed(name) == (plain, FINGERPRINT)
    assert unsealed_name(name) == plain
    # the older form reads as before: no fingerprint
    old = parse_encrypted_segment_name(plain + ".age", SEGMENT)
    assert old is not None
    assert old.fingerprint == ""
    assert split_sealed(plain + ".age") == (plain, "")


@pytest.mark.parametrize("name", [
    f"000000010000000A00000004.zst.{FINGERPRINT}.age",
    f"000000010000000A00000004.{FINGERPRINT}.age",
    "000000010000000A00000004.zst.age",
])
def test_postgresql_never_asks_for_a_sealed_name(name: str) -> None:
    assert not is_wal_file_name(name)
    assert not is_other_wal_file_name(name)
    assert parse_segment_file_name(name, SEGMENT) is None


@pytest.mark.parametrize("name", [
    f"000000010000000A00000004.zst.{FINGERPRINT.upper()}.age",  # upper-case: not a fingerprint
    f"000000010000000A00000004.zst.{FINGERPRINT[:15]}.age",
    f"000000010000000A00000004.zst.partial.{FINGERPRINT}.age",  # a .partial is never sealed
    f"000000010000000A00000004.{FINGERPRINT}.zst.age",  # the set is named after the method
    f"000000010000000A00000004.zst.{FINGERPRINT}.age.recipients",
    f"00000002.history.{FINGERPRINT}.age",
])
def test_what_is_not_a_sealed_segment_is_not_parsed_as_one(name: str) -> None:
    assert parse_archive_segment_name(name, SEGMENT) is None


def test_the_lean_gap_rule_sees_a_sealed_segment_in_either_form() -> None:
    assert sealed_suffix("") == ".age"
    assert sealed_suffix(FINGERPRINT) == f".{FINGERPRINT}.age"
    assert is_stored_suffix(f".zst.{FINGERPRINT}.age")
    assert is_stored_suffix(".zst.age")
    assert not is_stored_suffix(f".zst.{FINGERPRINT}.age.recipients")
    assert not is_stored_suffix(f".partial.{FINGERPRINT}.age")
    names = [f"000000010000000A00000006.zst.{FINGERPRINT}.age"]
    assert next_held_after("000000010000000A00000004", names) == "000000010000000A00000006"
    assert next_held_after("000000010000000A00000004",
                           ["000000010000000A00000006.zst.age.recipients"]) is None


# -- the readers, in either form ---------------------------------------------------------------
DATA = Path(__file__).parent / "data" / "wal"


def real_pair() -> dict[str, bytes]:
    """A real server's two 1 MiB segments (a record crosses from the first into the second)."""
    return {path.name[:24]: zstandard.ZstdDecompressor().decompress(path.read_bytes())
            for path in sorted(DATA.glob("*.zst"))}


def sealed_archive(root: Path, recipients: RecipientSet, form: str) -> dict[str, bytes]:
    """An archive of the real pair, the first segment sealed plain, the second compressed then
    sealed: in the ``new`` form (the set's fingerprint in each name, the set in the identity
    record) or the ``old`` one, as receivewal wrote it before (``F.age`` with
    ``F.age.recipients`` beside it, the record listing the set too)."""
    pair = real_pair()
    first, second = pair
    sysid = struct.unpack_from("<Q", pair[first], 24)[0]
    identity = ArchiveIdentity(str(sysid), 1 << 20, 1,
                               (AdoptedSet(recipients, "2026-01-01T00:00:00Z"),))
    root.mkdir()
    (root / IDENTITY_FILE).write_bytes(identity_to_json(identity))
    stored = {first: pair[first],
              second + ".zst": zstandard.ZstdCompressor().compress(pair[second])}
    for name, data in stored.items():
        sealed_bytes = agestream.encrypt_bytes(data, recipients)
        if form == "new":
            (root / encrypted_file_name(name, recipients.fingerprint)).write_bytes(sealed_bytes)
        else:
            (root / (name + ".age")).write_bytes(sealed_bytes)
            (root / (name + ".age.recipients")).write_bytes(recipients_file_text(recipients))
    return pair


@pytest.mark.parametrize("form", ["new", "old"])
def test_a_sealed_archive_in_either_form_restores_checks_and_verifies(
        tmp_path: Path, form: str) -> None:
    """Restore (the record crossing into the second segment checked through its sealed
    twin), the check without a key, the lean absence rule and verify read both forms; no key
    is NoIdentity naming the file and its set, the wrong key NotARecipient naming both."""
    key = new_identity_file(tmp_path / "key.txt")
    wrong = new_identity_file(tmp_path / "wrong.txt")
    recipients = recipient_set([key.recipient])
    archive = tmp_path / "archive"
    pair = sealed_archive(archive, recipients, form)
    first = next(iter(pair))
    for name in pair:
        target = tmp_path / name
        served = restore_file(archive, name, str(target), identity_file=str(key.path))
        assert target.read_bytes() == pair[name]
        assert served.name.endswith(f".{recipients.fingerprint}.age" if form == "new"
                                    else ".age")
        assert sealed.sealed_problem(str(served)) is None
        assert sealed.recipients_of(str(served)) == recipients
        assert not surely_absent(str(archive), name)
    with pytest.raises(sealed.NoIdentity) as none:
        restore_file(archive, first, str(tmp_path / "x"))
    assert first in str(none.value)
    assert recipients.fingerprint in str(none.value)
    with pytest.raises(NotARecipient) as refused:
        restore_file(archive, first, str(tmp_path / "x"), identity_file=str(wrong.path))
    assert first in str(refused.value)
    assert recipients.fingerprint in str(refused.value)
    later = "000000010000000000000008"
    assert surely_absent(str(archive), later)
    assert next_held_after("000000010000000000000005", os.listdir(archive)) == first
    done = receivewal_here("verify", "-D", str(archive), "--identity", str(key.path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 segments encrypted at rest" in done.stdout
    assert recipients.fingerprint in done.stdout


def test_a_sealed_name_whose_set_the_record_does_not_list_says_so(tmp_path: Path) -> None:
    """A file named for a set the identity record does not list: the check without a key
    names the file's set, and so does restore without a key."""
    key = new_identity_file(tmp_path / "key.txt")
    other = recipient_set([new_identity_file(tmp_path / "other.txt").recipient])
    archive = tmp_path / "archive"
    pair = sealed_archive(archive, recipient_set([key.recipient]), "new")
    first = next(iter(pair))
    stray = archive / encrypted_file_name(first, other.fingerprint)
    stray.write_bytes(agestream.encrypt_bytes(pair[first], other))
    problem = sealed.sealed_problem(str(stray))
    assert problem is not None
    assert other.fingerprint in problem
    assert "does not list" in problem
    with pytest.raises(sealed.NoIdentity, match="does not list"):
        sealed.Unsealer(None).opened(str(stray), 1 << 22)
