"""archive/sealed.py, the pieces the commands seal and unseal with (no server): a completed
file sealed with its recipients file, the check without a key, the reader with an identity
file, and the errors that name the file and its recipients."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from support.agekeys import KeyPair, age_command, new_identity_file

from receivewal.archive import agestream, sealed
from receivewal.archive.directory import Archive
from receivewal.archive.identity import ArchiveIdentity
from receivewal.archive.recipients import NotARecipient, recipient_set
from receivewal.secrets import IDENTITY_ENV


@pytest.fixture
def key(tmp_path: Path) -> KeyPair:
    return new_identity_file(tmp_path / "key.txt")


def test_seal_file_writes_the_recipients_file_then_the_age_file_and_removes_the_plain_one(
        tmp_path: Path, key: KeyPair) -> None:
    """seal_file(P) leaves P.age (the age command line decrypts it to P's bytes) and
    P.age.recipients (age -R takes it), and no P, no temporary file."""
    import subprocess  # noqa: PLC0415

    plain = tmp_path / "changes-000001.log"
    plain.write_bytes(b"x" * 300_000)
    recipients = recipient_set([key.recipient])
    target = sealed.seal_file(plain, recipients, mode=0o640)
    assert target == tmp_path / "changes-000001.log.age"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "changes-000001.log.age", "changes-000001.log.age.recipients", "key.txt"]
    assert target.stat().st_mode & 0o777 == 0o640
    done = subprocess.run([age_command(), "-d", "-i", str(key.path), str(target)],
                          capture_output=True, check=True)
    assert done.stdout == b"x" * 300_000
    assert sealed.read_recipients(str(target)) == recipients
    assert sealed.sealed_problem(str(target)) is None


def test_the_check_without_a_key_names_what_is_wrong(tmp_path: Path, key: KeyPair) -> None:
    """No recipients file, or one that lists more recipients than the header has stanzas,
    or a file that is no age file: each is a reason naming the file."""
    other = new_identity_file(tmp_path / "other.txt")
    path = tmp_path / "F.age"
    path.write_bytes(agestream.encrypt_bytes(b"wal", recipient_set([key.recipient])))
    assert "has no recipients file" in str(sealed.sealed_problem(str(path)))
    sealed.write_recipients_file(path, recipient_set([key.recipient, other.recipient]))
    assert "lists 2" in str(sealed.sealed_problem(str(path)))
    path.write_bytes(b"not an age file")
    assert "not a binary age file" in str(sealed.sealed_problem(str(path)))


def test_the_unsealer_says_who_can_read_a_file_without_or_with_the_wrong_key(
        tmp_path: Path, key: KeyPair) -> None:
    """Without an identity file: NoIdentity naming the file, its recipients and the option;
    with one that holds none of its keys: NotARecipient before any decryption; with the key:
    the plaintext."""
    wrong = new_identity_file(tmp_path / "wrong.txt")
    recipients = recipient_set([key.recipient])
    path = tmp_path / "F.zst.age"
    path.write_bytes(agestream.encrypt_bytes(b"segment", recipients))
    sealed.write_recipients_file(path, recipients)
    with pytest.raises(sealed.NoIdentity) as none:
        sealed.Unsealer(None).opened(str(path), 1 << 20)
    for word in (str(path), key.recipient, recipients.fingerprint, "--identity",
                 IDENTITY_ENV):
        assert word in str(none.value)
    with pytest.raises(NotARecipient) as refused:
        sealed.Unsealer(str(wrong.path)).opened(str(path), 1 << 20)
    assert wrong.recipient in str(refused.value)
    assert sealed.Unsealer(str(key.path)).opened(str(path), 1 << 20).read() == b"segment"


def test_a_file_read_twice_in_a_row_is_decrypted_once(tmp_path: Path, key: KeyPair,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The next segment's first pages, then the same segment as itself: one decryption; a
    changed file is decrypted again."""
    recipients = recipient_set([key.recipient])
    path = tmp_path / "F.age"
    path.write_bytes(agestream.encrypt_bytes(b"one", recipients))
    sealed.write_recipients_file(path, recipients)
    calls = []
    real = agestream.decrypt_bytes

    def counted(*args: object, **kwargs: object) -> bytes:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(agestream, "decrypt_bytes", counted)
    unsealer = sealed.Unsealer(str(key.path))
    assert unsealer.opened(str(path), 1 << 20).read() == b"one"
    assert unsealer.opened(str(path), 1 << 20).read() == b"one"
    assert len(calls) == 1
    path.write_bytes(agestream.encrypt_bytes(b"two", recipients))
    assert unsealer.opened(str(path), 1 << 20).read() == b"two"
    assert len(calls) == 2


def test_the_decrypting_opener_pickles_without_its_keys(tmp_path: Path, key: KeyPair) -> None:
    """verify's and analyze's workers get the opener by pickle: the identity file's path
    goes, never a loaded key; the copy decrypts."""
    recipients = recipient_set([key.recipient])
    path = tmp_path / "F.age"
    path.write_bytes(agestream.encrypt_bytes(b"wal", recipients))
    sealed.write_recipients_file(path, recipients)
    opener = sealed.DecryptingOpener(None, str(key.path), 1 << 20)
    assert opener(str(path)).read() == b"wal"
    data = pickle.dumps(opener)
    assert b"AGE-SECRET-KEY" not in data
    assert pickle.loads(data)(str(path)).read() == b"wal"  # noqa: S301 - our own bytes


def test_adopt_recipients_appends_a_new_set_once(tmp_path: Path, key: KeyPair) -> None:
    """The identity record gains the set the first time, not again while it is the newest."""
    other = new_identity_file(tmp_path / "other.txt")
    archive = Archive(tmp_path)
    archive.write_identity(ArchiveIdentity("7312345678901234567", 16 << 20, 1))
    first = recipient_set([key.recipient])
    both = recipient_set([key.recipient, other.recipient])
    assert archive.adopt_recipients(first).recipient_sets[-1].recipients == first
    assert len(archive.adopt_recipients(first).recipient_sets) == 1
    assert [s.recipients for s in archive.adopt_recipients(both).recipient_sets] == \
        [first, both]
    read = archive.read_identity()
    assert read is not None
    assert [s.recipients for s in read.recipient_sets] == [first, both]


@pytest.mark.parametrize(("given", "words"), [
    ("age1notarecipient", "invalid age recipient"),
    ("AGE-SECRET-KEY-1QQQQ", "a private key was given as a recipient"),
])
def test_stream_refuses_a_bad_recipient_before_connecting(tmp_path: Path, given: str,
                                                          words: str) -> None:
    """--encrypt-to is checked before any connection (the server named does not exist): one
    line saying what is wrong, never echoing a private key, exit 1; nothing written."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run([sys.executable, "-m", "receivewal", "stream", "-D", str(tmp_path),
                           "-d", "host=/nonexistent", "-n", "--encrypt-to", given],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1, done.stderr
    assert words in done.stderr
    assert "AGE-SECRET-KEY-1QQQQ" not in done.stderr
    assert "nonexistent" not in done.stderr  # no connection was tried
    assert list(tmp_path.iterdir()) == []
