"""Binary column values as text, checked against a real server: for each common type, many
values (random ones and the edges) sent through the type's own send function and converted
here give exactly the server's text output (DateStyle ISO, TimeZone UTC); the built-in type
names are the server's."""

from __future__ import annotations

import math
import random
import struct
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from support.servers import running_server

from receivewal.logical.binary import binary_to_text
from receivewal.logical.typenames import BUILT_IN_TYPES

pytestmark = pytest.mark.server
RNG = random.Random(2027)  # noqa: S311 - test data, not cryptography


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with running_server() as pg, psycopg.connect(pg.dsn, autocommit=True) as connection:
        connection.execute("SET datestyle = ISO; SET timezone = UTC; "
                           "SET extra_float_digits = 1; SET bytea_output = hex")
        yield connection


def server_pairs(conn: psycopg.Connection[tuple[object, ...]], type_name: str,
                 literals: list[str]) -> tuple[int, list[tuple[str, bytes]]]:
    """The type's OID, and each literal's text from the type's output function (what
    pgoutput sends as text) and binary form from its send function."""
    row = conn.execute("SELECT oid::int, typoutput::text, typsend::text FROM pg_type "
                       "WHERE oid = %s::regtype", [type_name]).fetchone()
    assert row is not None
    type_id, output, send = row
    rows = conn.execute(f"SELECT {output}(t::{type_name})::text, {send}(t::{type_name}) "
                        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
                        [literals]).fetchall()
    pairs = []
    for text, raw in rows:
        assert isinstance(raw, bytes)
        pairs.append((str(text), raw))
    return int(str(type_id)), pairs


def random_float4() -> str:
    while True:
        bits = RNG.getrandbits(32)
        if (bits >> 23) & 0xFF != 0xFF:
            return f"{struct.unpack('>f', bits.to_bytes(4, 'big'))[0]:.9g}"


def random_float8() -> str:
    if RNG.random() < 0.5:  # integers beyond 2**53: where a short decimal can sit on a bound
        return repr(float(RNG.randrange(2**53, 2**64)))
    while True:
        value = struct.unpack(">d", RNG.getrandbits(64).to_bytes(8, "big"))[0]
        if math.isfinite(value):
            return repr(value)


def random_date() -> str:
    bc = RNG.random() < 0.1
    year = RNG.randrange(1, 4713 if bc else 10000)
    return f"{year:04d}-{RNG.randrange(1, 13):02d}-{RNG.randrange(1, 29):02d}" + \
        (" BC" if bc else "")


def random_time() -> str:
    return f"{RNG.randrange(24):02d}:{RNG.randrange(60):02d}:{RNG.randrange(60):02d}" \
        f".{RNG.randrange(10 ** 6):06d}"[:RNG.randrange(8, 16)]


CASES: dict[str, list[str]] = {
    "int2": ["0", "-32768", "32767", *[str(RNG.randrange(-32768, 32768)) for _ in range(50)]],
    "int4": ["0", "-2147483648", "2147483647",
             *[str(RNG.randrange(-2**31, 2**31)) for _ in range(50)]],
    "int8": ["0", str(-2**63), str(2**63 - 1), *[str(RNG.randrange(-2**63, 2**63))
                                                  for _ in range(50)]],
    "oid": ["0", "4294967295", "16384"],
    "float4": ["0", "-0", "NaN", "Infinity", "-Infinity", "1", "0.1", "123456", "1234567",
               "1e-05", "0.0001", "3.4028235e38", "1e-45", "121338016",
               *[random_float4() for _ in range(2000)]],
    "float8": ["0", "-0", "NaN", "Infinity", "-Infinity", "0.1", "1e15", "1e14",
               "123456789012345", "5e-324", "1.7976931348623157e308", "1e-05",
               *[random_float8() for _ in range(2000)]],
    "numeric": ["0", "1", "-1", "0.0001", "123.4500", "10000", "99999999.99999", "0.00",
                "-0.000000012", "1e100", "NaN", "Infinity", "-Infinity",
                "12345678901234567890.123456789",
                *[f"{RNG.uniform(-1e6, 1e6):.{RNG.randrange(0, 20)}f}" for _ in range(300)],
                *[str(RNG.randrange(-10**40, 10**40)) for _ in range(100)]],
    "bool": ["t", "f"],
    "text": ["", "plain", "caf\u00e9 \u2603 \U0001f418", "quote ' and \" and \\", "tab\tnew\nline"],
    "varchar": ["", "x" * 300, "\u00fc"],
    "bpchar": ["a", "  spaced  "],
    "name": ["pg_class", "a" * 63],
    "bytea": ["\\x", "\\x00ff10", *["\\x" + RNG.randbytes(RNG.randrange(40)).hex()
                                   for _ in range(30)]],
    "uuid": [str(uuid.UUID(int=RNG.getrandbits(128))) for _ in range(30)],
    "json": ['{"b": [1, 2.50, null],  "a": "x"}', "[]", '"\u00e9"'],
    "jsonb": ['{"b": [1, 2.50, null],  "a": "x"}', "[]", '{"a": {"b": "\u2603"}}', "1e3"],
    "date": ["2000-01-01", "1970-01-01", "0044-03-15 BC", "4713-01-01 BC", "5874897-12-31",
             "infinity", "-infinity", "2024-02-29", "1582-10-04", "0001-01-01",
             "0001-12-31 BC", *[random_date() for _ in range(300)]],
    "time": ["00:00:00", "24:00:00", "12:34:56.789", "23:59:59.999999", "01:02:03.1",
             *[random_time() for _ in range(100)]],
    "timestamp": ["2000-01-01 00:00:00", "1999-12-31 23:59:59.999999",
                  "0044-03-15 12:00:00.5 BC", "294276-12-31 23:59:59.999999",
                  "4713-01-01 00:00:00 BC", "infinity", "-infinity",
                  *[f"{random_date()} {random_time()}" for _ in range(300)]],
    "timestamptz": ["2000-01-01 00:00:00+00", "2026-11-26 10:00:00.123+05:30",
                    "0044-03-15 12:00:00.5 BC", "infinity", "-infinity",
                    *[f"{random_date()} {random_time()}+00" for _ in range(300)]],
}


@pytest.mark.parametrize("type_name", list(CASES))
def test_binary_values_read_as_the_servers_text_output(
        conn: psycopg.Connection[tuple[object, ...]], type_name: str) -> None:
    """Every value of the type: the server's send function's bytes, converted, equal the
    server's output function's text."""
    type_id, pairs = server_pairs(conn, type_name, CASES[type_name])
    assert len(pairs) == len(CASES[type_name])
    wrong = [(text, raw.hex(), binary_to_text(type_id, raw)) for text, raw in pairs
             if binary_to_text(type_id, raw) != text]
    assert wrong == []


def test_other_types_are_not_converted(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """interval, inet, an array, a point: None (the change log keeps their bytes)."""
    for type_name in ("interval", "inet", "int4[]", "point", "timetz", "money"):
        row = conn.execute("SELECT %s::regtype::oid::int", [type_name]).fetchone()
        assert row is not None
        assert binary_to_text(int(str(row[0])), b"\0" * 8) is None


def test_malformed_binary_values_are_refused() -> None:
    """A binary value of the wrong size or an impossible numeric is a ValueError (the
    change log turns it into a ProtocolError naming the LSN)."""
    for type_id, data in ((23, b"\0\0\0"), (701, b"\0" * 4), (2950, b"\0" * 15),
                          (1700, b"\0\x01\0\0\0\0\0\0"), (1700, b"\0\x01\0\0\0\0\0\0\x27\x10"),
                          (1700, b"\0\0\0\0\x12\x34\0\0"), (3802, b"\x02{}"), (25, b"\xff"),
                          (1083, (86_400_000_001).to_bytes(8, "big"))):
        with pytest.raises(ValueError, match=r"\w"):
            binary_to_text(type_id, data)


def test_the_built_in_type_names_are_the_servers(
        conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Every pg_catalog type under OID 10000 of the running server, by OID and name."""
    rows = conn.execute("SELECT oid::int, typname::text FROM pg_type WHERE oid < 10000 AND "
                        "typnamespace = 'pg_catalog'::regnamespace").fetchall()
    assert {int(str(oid)): str(name) for oid, name in rows} == BUILT_IN_TYPES

