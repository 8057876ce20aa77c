"""Who can read an encrypted archive file (pure): age recipients, recipient sets, the
recipients file next to each encrypted file, the sets the identity record lists, and the age
header's stanzas.

A file encrypted at rest is a standard age file (``age-encryption.org/v1``, X25519 recipients;
see :mod:`receivewal.archive.encryption`). Its X25519 stanzas do not name their recipients:
nobody holding only public keys can tell from the file whom it is for. So every encrypted file
``F`` (``000000010000000000000004.zst.age``) has ``F.recipients`` next to it, an age recipients
file (``age -R`` reads it: comments, then one ``age1...`` per line) listing the
:class:`RecipientSet` it was encrypted to, written before ``F`` is; and the archive's identity
record lists every set the archive has used, in the order they were adopted
(:class:`AdoptedSet`, the record's optional ``recipient_sets``). A set is known by its
fingerprint, 16 hex digits of the SHA-256 of its sorted recipients.

:func:`require_readable` is the check before decryption: given the public keys of an identity
file (its private keys' recipients) and a file's set, it says whether the identity can read the
file, else raises :class:`NotARecipient` naming the file, the recipients it is for and the
identity file's keys. Decryption itself stays the authority (a file whose header does not open
with a key its recipients file names is damaged), and :func:`read_age_header` lets a reader
without any key check that a file's X25519 stanzas are as many as its set's recipients.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from receivewal.errors import ArchiveError

#: What an X25519 recipient looks like: ``age1`` and 58 Bech32 characters (lower case).
RECIPIENT_PREFIX = "age1"
RECIPIENT_LENGTH = 62
_BECH32 = frozenset("qpzry9x8gf2tvdw0s3jn54khce6mua7l")
#: The most a recipients file may hold (a set of many hundred recipients).
RECIPIENTS_FILE_CAP = 64 << 10
#: The most an age header may take before its MAC line (each X25519 stanza takes ~110 bytes).
AGE_HEADER_CAP = 64 << 10
AGE_MAGIC = b"age-encryption.org/v1\n"
_STANZA = b"-> "
_MAC = b"--- "
_BASE64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_BODY_COLUMNS = 64
_MAC_LENGTH = 43  # 32 bytes in unpadded base64


class RecipientsError(ArchiveError):
    """A recipients file, a recipient set of the identity record or an age header that cannot
    be read as one."""


class NotARecipient(ArchiveError):  # noqa: N818 - reads as what the caller is told
    """An identity file holds none of the keys a file is encrypted to: decrypting it cannot
    succeed (restore exits 126). Never retryable: the file will not change."""

    def __init__(self, file: str, recipients: RecipientSet | None, key_file: str,
                 keys: Iterable[str]) -> None:
        held = ", ".join(sorted(keys)) or "no key"
        if recipients is None:  # its recipients file is not at hand: age's answer alone
            super().__init__(f'"{file}" cannot be decrypted with the identity file '
                             f'"{key_file}" ({held}): it is not encrypted to any of its keys '
                             "(or its age header is damaged)")
        else:
            super().__init__(f'"{file}" is encrypted to {recipients.describe()}; the identity '
                             f'file "{key_file}" holds {held}: none of them can decrypt it')
        self.file, self.recipients, self.key_file = file, recipients, key_file


def is_recipient(text: str) -> bool:
    """Whether ``text`` has the shape of an age X25519 recipient (``age1`` + 58 Bech32
    characters); :func:`receivewal.archive.encryption.parse_recipient` checks its checksum
    and point too."""
    return len(text) == RECIPIENT_LENGTH and text.startswith(RECIPIENT_PREFIX) \
        and _BECH32.issuperset(text[len(RECIPIENT_PREFIX):])


@dataclass(frozen=True)
class RecipientSet:
    """The recipients one file is encrypted to: sorted, each once (build it with
    :func:`recipient_set`)."""

    recipients: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the SHA-256 of the sorted recipients, one per line."""
        import hashlib  # noqa: PLC0415 - only where a set is named

        text = "".join(f"{recipient}\n" for recipient in self.recipients)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """The set as messages name it: its recipients and fingerprint."""
        return f"{', '.join(self.recipients)} (recipient set {self.fingerprint})"

    def __len__(self) -> int:
        return len(self.recipients)


def recipient_set(recipients: Iterable[str]) -> RecipientSet:
    """A set of X25519 recipients, sorted and each once; RecipientsError for an empty set or
    a string that is not a recipient's shape."""
    unique = sorted(set(recipients))
    if not unique:
        raise RecipientsError("a recipient set needs at least one recipient")
    for recipient in unique:
        if not is_recipient(recipient):
            raise RecipientsError(f"{recipient[:80]!r} is not an age X25519 recipient "
                                  f"(age1 and {RECIPIENT_LENGTH - 4} Bech32 characters)")
    return RecipientSet(tuple(unique))


def require_readable(recipients: RecipientSet, keys: Iterable[str], *, file: str,
                     key_file: str) -> None:
    """Nothing when one of ``keys`` (the recipients of an identity file's private keys) is
    among ``recipients`` (a file's set); NotARecipient naming ``file``, its recipients,
    ``key_file`` and its keys otherwise."""
    held = frozenset(keys)
    if held.isdisjoint(recipients.recipients):
        raise NotARecipient(file, recipients, key_file, held)


# -- the recipients file next to an encrypted file ---------------------------------------------
def recipients_file_text(recipients: RecipientSet) -> bytes:
    """The content of ``F.recipients`` for a file ``F`` encrypted to ``recipients``: an age
    recipients file (``age -R`` reads it)."""
    head = (f"# receivewal: the age recipients this file's encrypted twin is for "
            f"(recipient set {recipients.fingerprint})\n")
    return (head + "".join(f"{recipient}\n" for recipient in recipients.recipients)).encode()


def listed_lines(data: bytes, cap: int) -> list[tuple[int, str]]:
    """The lines of an age recipients or identity file that are neither blank nor ``#``
    comments, stripped, with their numbers; ValueError saying why ``data`` is no such file
    (larger than ``cap``, not text)."""
    if len(data) > cap:
        raise ValueError(f"holds more than {cap} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not text") from None
    lines = ((number, line.strip()) for number, line in enumerate(text.splitlines(), 1))
    return [(number, line) for number, line in lines if line and not line.startswith("#")]


def parse_recipients_file(data: bytes, where: str) -> RecipientSet:
    """The set a recipients file lists (comments and blank lines allowed, as age allows them);
    RecipientsError naming ``where`` and the line when it holds anything else."""
    try:
        lines = listed_lines(data, RECIPIENTS_FILE_CAP)
    except ValueError as exc:
        raise RecipientsError(f'"{where}" {exc}: not a recipients file') from None
    found = []
    for number, line in lines:
        if not is_recipient(line):
            raise RecipientsError(f'"{where}" line {number}: {line[:80]!r} is not an age '
                                  "X25519 recipient")
        found.append(line)
    if not found:
        raise RecipientsError(f'"{where}" lists no recipient')
    return recipient_set(found)


# -- the sets the identity record lists --------------------------------------------------------
@dataclass(frozen=True)
class AdoptedSet:
    """A recipient set the archive has encrypted to, from ``since`` (ISO 8601 UTC, when the
    writer adopted it, before it encrypted anything to it)."""

    recipients: RecipientSet
    since: str


def adopting(sets: tuple[AdoptedSet, ...], recipients: RecipientSet, since: str,
             ) -> tuple[AdoptedSet, ...]:
    """The identity record's sets once a writer encrypts to ``recipients``: as they are when it
    is the newest set already, else with it appended (a set used again is listed again)."""
    if sets and sets[-1].recipients == recipients:
        return sets
    return (*sets, AdoptedSet(recipients, since))


def sets_from_json(value: object) -> tuple[AdoptedSet, ...]:
    """The identity record's ``recipient_sets`` (None or absent: no set); ValueError or
    TypeError saying what is wrong, as the record's other fields."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError("recipient_sets is not a list")
    sets = []
    for number, item in enumerate(value, 1):
        if not isinstance(item, dict):
            raise TypeError(f"recipient_sets[{number}] is not an object")
        listed, since, fingerprint = (item.get(key) for key in
                                      ("recipients", "since", "fingerprint"))
        if not isinstance(listed, list) or not all(isinstance(r, str) for r in listed):
            raise TypeError(f"recipient_sets[{number}].recipients is not a list of strings")
        if not isinstance(since, str) or not isinstance(fingerprint, str):
            raise TypeError(f"recipient_sets[{number}]: since and fingerprint must be strings")
        try:
            recipients = recipient_set(listed)
        except RecipientsError as exc:
            raise ValueError(f"recipient_sets[{number}]: {exc}") from None
        if recipients.recipients != tuple(listed):
            raise ValueError(f"recipient_sets[{number}].recipients are not sorted and unique")
        if fingerprint != recipients.fingerprint:
            raise ValueError(f"recipient_sets[{number}].fingerprint {fingerprint[:40]!r} is "
                             f"not its recipients' ({recipients.fingerprint})")
        sets.append(AdoptedSet(recipients, since))
    return tuple(sets)


def sets_to_json(sets: tuple[AdoptedSet, ...]) -> list[dict[str, object]]:
    """The identity record's ``recipient_sets`` value."""
    return [{"fingerprint": adopted.recipients.fingerprint, "since": adopted.since,
             "recipients": list(adopted.recipients.recipients)} for adopted in sets]


# -- the age header ----------------------------------------------------------------------------
@dataclass(frozen=True)
class AgeHeader:
    """What an age file's header says without any key: its stanzas' types, in order, and
    where its payload starts."""

    stanza_types: tuple[str, ...]
    length: int

    @property
    def x25519_stanzas(self) -> int:
        """How many X25519 recipients the file's key is wrapped for."""
        return self.stanza_types.count("X25519")


def read_age_header(data: bytes, where: str) -> AgeHeader:
    """The header at the start of ``data`` (the first bytes of a binary age file: the header is
    at most :data:`AGE_HEADER_CAP`); RecipientsError naming ``where`` when it is not one.
    Reads the format only: its MAC is checked by decryption."""
    if not data.startswith(AGE_MAGIC):
        raise RecipientsError(f'"{where}" is not a binary age file (no age-encryption.org/v1 '
                              "header)")
    position, types = len(AGE_MAGIC), list[str]()
    while True:
        line, position = _header_line(data, position, where)
        if line.startswith(_MAC):
            mac = line[len(_MAC):]
            if len(mac) != _MAC_LENGTH or not _BASE64.issuperset(mac) or not types:
                raise RecipientsError(f'"{where}": the age header ends in a malformed MAC line')
            return AgeHeader(tuple(types), position)
        if not line.startswith(_STANZA):
            raise RecipientsError(f'"{where}": the age header holds a line that is neither a '
                                  "stanza nor its MAC")
        arguments = line[len(_STANZA):].split(b" ")
        if not all(arguments) or not all(0x21 <= c <= 0x7E for arg in arguments for c in arg):
            raise RecipientsError(f'"{where}": an age stanza line is malformed')
        types.append(arguments[0].decode("ascii"))
        position = _skip_body(data, position, where)


def _header_line(data: bytes, position: int, where: str) -> tuple[bytes, int]:
    """The header line at ``position`` (without its newline) and where the next one starts."""
    end = data.find(b"\n", position, AGE_HEADER_CAP)
    if end < 0:
        raise RecipientsError(f'"{where}": the age header is cut short or longer than '
                              f"{AGE_HEADER_CAP} bytes")
    return data[position:end], end + 1


def _skip_body(data: bytes, position: int, where: str) -> int:
    """Where the stanza body starting at ``position`` ends (after its short last line)."""
    while True:
        line, position = _header_line(data, position, where)
        if len(line) > _BODY_COLUMNS or not _BASE64.issuperset(line):
            raise RecipientsError(f'"{where}": an age stanza body is malformed')
        if len(line) < _BODY_COLUMNS:
            return position


def check_stanzas(header: AgeHeader, recipients: RecipientSet, where: str) -> None:
    """RecipientsError naming ``where`` when the file's X25519 stanzas are not as many as
    the recipients its recipients file lists (one of them is not what it says)."""
    if header.x25519_stanzas != len(recipients):
        raise RecipientsError(f'"{where}" is encrypted to {header.x25519_stanzas} X25519 '
                              f"recipient(s), but its recipients file lists {len(recipients)}: "
                              f"{recipients.describe()}")
