"""One object per sealed file (issue 34 §2): a sealed file's name carries the fingerprint of
the recipient set it is sealed to (``NAME[.zst].FINGERPRINT.age``), read unambiguously by the
full name parser and by restore's lean one; the older form (``NAME[.zst].age`` beside its
recipients file) still reads."""

from __future__ import annotations

import pytest

from receivewal.archive.recipients import recipient_set
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
