"""Encryption at rest, the keys: age recipients and identity files, and pyrage's one door.

An encrypted archive file is a standard binary age file (``age-encryption.org/v1``) to X25519
recipients: what ``age -d -i KEYFILE`` decrypts. The cryptography is age's, done by pyrage (the
Rust ``age`` crate). This module is the only one that imports it, on first use
(:func:`pyrage`): without the ``encrypt`` extra, using it is a ConfigurationError saying what
to install, and nothing else loads it (a restore of a file that is not encrypted never does).
The age files themselves are written and read, as streams or whole, by
:mod:`receivewal.archive.agestream`, through :func:`pyrage` and the keys given here.

:func:`parse_recipient` and :func:`recipients_of` read ``age1...`` recipients (the public keys
a writer encrypts to: the archiving host holds only those), :func:`load_identity_file` reads an
identity file as ``age-keygen`` writes it (``AGE-SECRET-KEY-1...`` lines, comments) into
:class:`Keys`; errors name the file and the line, never a private key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from receivewal.archive.recipients import (
    RECIPIENT_PREFIX,
    RecipientsError,
    RecipientSet,
    listed_lines,
    recipient_set,
    require_readable,
)
from receivewal.errors import ConfigurationError
from receivewal.secrets import is_private_key, key_given_as_file

IDENTITY_FILE_CAP = 1 << 20
_SECRET_PREFIX = "AGE-SECRET-KEY-1"  # noqa: S105 - the prefix of the format, not a key


def pyrage() -> ModuleType:
    """pyrage, imported on first use (ConfigurationError saying what to install without it)."""
    try:
        import pyrage as module  # noqa: PLC0415 - lazily, see the module's docstring
    except ImportError:
        raise ConfigurationError("encryption at rest needs pyrage: "
                                 "pip install 'receivewal[encrypt]'") from None
    loaded: ModuleType = module
    return loaded


class KeyFileError(ConfigurationError):
    """A recipient or an identity file that cannot be used: missing, unreadable, or not what
    age writes. Its message names the file and line, never a private key."""


# -- keys --------------------------------------------------------------------------------------
def parse_recipient(text: str) -> str:
    """The X25519 recipient ``text`` names (``age1...``, as ``age-keygen`` prints it), checked
    (Bech32 checksum, a curve point); KeyFileError saying what is wrong."""
    candidate = text.strip()
    if candidate.upper().startswith(_SECRET_PREFIX):
        raise KeyFileError("a private key was given as a recipient: give its public key "
                           "(age-keygen -y FILE prints it), and keep the private key off this "
                           "host")
    shown = candidate[:80]
    if not candidate.startswith(RECIPIENT_PREFIX):
        raise KeyFileError(f'invalid age recipient "{shown}": an X25519 recipient starts with '
                           f"{RECIPIENT_PREFIX} (age-keygen prints it as the public key)")
    x25519 = pyrage().x25519
    try:
        recipient = x25519.Recipient.from_str(candidate)
    except pyrage().RecipientError as exc:
        raise KeyFileError(f'invalid age recipient "{shown}": {exc} (only X25519 recipients, '
                           "age1..., are supported)") from None
    return str(recipient)


def recipients_of(texts: Iterable[str]) -> RecipientSet:
    """The set of the recipients ``texts`` name (``--encrypt-to``, repeatable); KeyFileError
    for a bad one or none."""
    parsed = [parse_recipient(text) for text in texts]
    try:
        return recipient_set(parsed)
    except RecipientsError as exc:
        raise KeyFileError(str(exc)) from None


@dataclass(frozen=True)
class Keys:
    """The private keys of an identity file (``--identity FILE``) and their recipients."""

    path: str
    public: frozenset[str]  # the recipients the keys decrypt for
    identities: tuple[Any, ...] = field(repr=False)  # pyrage's: never printed

    def can_read(self, recipients: RecipientSet) -> bool:
        """Whether one of these keys is among a file's ``recipients`` (its recipients file)."""
        return not self.public.isdisjoint(recipients.recipients)

    def require(self, recipients: RecipientSet, *, file: str) -> None:
        """Nothing when :meth:`can_read`; NotARecipient naming ``file``, its recipients, this
        identity file and its keys otherwise (before anything is fetched or written)."""
        require_readable(recipients, self.public, file=file, key_file=self.path)


def load_identity_file(path: str) -> Keys:
    """The X25519 identities of the file at ``path``, as ``age-keygen`` writes it: lines
    ``AGE-SECRET-KEY-1...``, blank lines and ``#`` comments. A FIFO works (``<(...)``).
    KeyFileError naming the file (and line) when it is missing, unreadable, too large or
    holds anything else, or no identity at all; one that is a key itself (given instead of
    its file) is refused without being shown."""
    if is_private_key(path):
        raise KeyFileError(key_given_as_file("the identity file (--identity, "
                                             "RECEIVEWAL_IDENTITY)"))
    try:
        with open(path, "rb") as fh:
            data = fh.read(IDENTITY_FILE_CAP + 1)
    except FileNotFoundError:
        raise KeyFileError(f'identity file "{path}" does not exist') from None
    except OSError as exc:
        raise KeyFileError(f'cannot read identity file "{path}": {exc.strerror or exc}'
                           ) from None
    try:
        lines = listed_lines(data, IDENTITY_FILE_CAP)
    except ValueError as exc:
        raise KeyFileError(f'identity file "{path}" {exc}: not an age identity file') from None
    module = pyrage()
    identities = []
    for number, stripped in lines:
        if stripped.startswith(RECIPIENT_PREFIX):
            raise KeyFileError(f'identity file "{path}" line {number} holds a recipient (a '
                               "public key), not an identity: give the file age-keygen wrote")
        if not stripped.startswith(_SECRET_PREFIX):
            raise KeyFileError(f'identity file "{path}" line {number} is not an age X25519 '
                               f"identity ({_SECRET_PREFIX}...)")
        try:
            identities.append(module.x25519.Identity.from_str(stripped))
        except module.IdentityError:
            raise KeyFileError(f'identity file "{path}" line {number} is not a valid age '
                               "X25519 identity (its Bech32 encoding is damaged)") from None
    if not identities:
        raise KeyFileError(f'identity file "{path}" holds no identity')
    public = frozenset(str(identity.to_public()) for identity in identities)
    return Keys(path, public, tuple(identities))


def recipient_objects(recipients: RecipientSet) -> list[Any]:
    """pyrage's recipients of ``recipients`` (what its encryption calls take)."""
    x25519 = pyrage().x25519
    return [x25519.Recipient.from_str(recipient) for recipient in recipients.recipients]
