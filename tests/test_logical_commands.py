"""The logical slot's replication commands as text: names quoted as identifiers, option values
as string literals, the syntax of the server's version. The server accepts them in
test_logical_stream.py."""

from __future__ import annotations

import pytest

from receivewal.errors import ConfigurationError
from receivewal.replication.commands import (
    create_logical_slot_command,
    quote_identifier,
    quote_literal,
    start_logical_replication_command,
)


@pytest.mark.parametrize(("name", "quoted"), [
    ("slot", '"slot"'), ("Odd Name", '"Odd Name"'), ('a"b', '"a""b"'),
    ("binary.want_binary_basetypes", '"binary.want_binary_basetypes"'), ("x'y", '"x\'y"')])
def test_identifiers_are_double_quoted(name: str, quoted: str) -> None:
    """A double quote is doubled; case, dots, spaces and single quotes are kept."""
    assert quote_identifier(name) == quoted


@pytest.mark.parametrize(("value", "quoted"), [
    ("3", "'3'"), ("it's", "'it''s'"), ("back\\slash", "'back\\slash'"),
    ('"p1","p2"', "'\"p1\",\"p2\"'"), ("", "''")])
def test_values_are_string_literals(value: str, quoted: str) -> None:
    """A single quote is doubled; a backslash is an ordinary character to the walsender's
    scanner, so it stays one."""
    assert quote_literal(value) == quoted


@pytest.mark.parametrize("bad", ["", "a\0b"])
def test_names_and_values_the_protocol_cannot_carry_are_refused(bad: str) -> None:
    """An empty name, or a zero byte in a name or value, is a configuration error."""
    with pytest.raises(ConfigurationError):
        quote_identifier(bad)
    if bad:
        with pytest.raises(ConfigurationError):
            quote_literal(bad)


def test_create_a_logical_slot() -> None:
    """PostgreSQL 15's option list (no snapshot exported, TWO_PHASE when asked); before 15
    the old keyword, and two-phase refused."""
    assert create_logical_slot_command("s1", "pgoutput", two_phase=True,
                                       server_version=150018) == \
        """CREATE_REPLICATION_SLOT "s1" LOGICAL "pgoutput" (SNAPSHOT 'nothing', TWO_PHASE)"""
    assert create_logical_slot_command("s1", "pglogical_output", two_phase=False,
                                       server_version=160000) == \
        """CREATE_REPLICATION_SLOT "s1" LOGICAL "pglogical_output" (SNAPSHOT 'nothing')"""
    assert create_logical_slot_command("s1", "pgoutput", two_phase=False,
                                       server_version=140005) == \
        'CREATE_REPLICATION_SLOT "s1" LOGICAL "pgoutput" NOEXPORT_SNAPSHOT'
    with pytest.raises(ConfigurationError, match="two-phase slot needs PostgreSQL 15"):
        create_logical_slot_command("s1", "pgoutput", two_phase=True, server_version=140005)


def test_start_logical_replication() -> None:
    """The slot, the LSN as PostgreSQL prints it, and each option quoted; an option without
    a value is its name alone; no options, no parentheses."""
    assert start_logical_replication_command(
        "s1", 0x1_6B3748, [("proto_version", "3"), ("publication_names", '"a","B c"'),
                           ("binary.want_binary_basetypes", "1"), ("flag", None)]) == (
        'START_REPLICATION SLOT "s1" LOGICAL 0/16B3748 ("proto_version" \'3\', '
        '"publication_names" \'"a","B c"\', "binary.want_binary_basetypes" \'1\', "flag")')
    assert start_logical_replication_command("s1", 0, []) == \
        'START_REPLICATION SLOT "s1" LOGICAL 0/0'
