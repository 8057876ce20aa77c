"""Binary column values (the types' send functions) as PostgreSQL's text output (pure).

With binary transfer a column's value arrives as its type's ``*send`` function wrote it. For
the common built-in types :func:`binary_to_text` gives the string the type's output function
prints (with ``DateStyle = ISO``, ``TimeZone = UTC``, ``extra_float_digits = 1`` and
``bytea_output = hex``, PostgreSQL's defaults but the time zone), so a change log reads the
same whether the stream was text or binary. Any other type gives None: the caller keeps the
bytes (``{"binary_b64": ...}``). A value whose bytes cannot be what the send function wrote
(a wrong length, a numeric digit over 9999) raises ValueError.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

from receivewal.logical.pgtime import format_date, format_time, format_timestamp

# built-in type OIDs (pg_type.dat)
BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR = 114, 700, 701, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1082, 1083, 1114, 1184, 1700, 2950, 3802

_NUMERIC_SIGNS = {0x0000: "", 0x4000: "-"}
_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}
_NBASE = 10_000


def binary_to_text(type_id: int, data: bytes) -> str | None:
    """The text PostgreSQL's output function gives for ``data`` (a value of type
    ``type_id`` in its binary form), or None for a type not converted here."""
    convert = _CONVERTERS.get(type_id)
    return None if convert is None else convert(data)


def _fixed(size: int, data: bytes, what: str) -> bytes:
    if len(data) != size:
        raise ValueError(f"a binary {what} has {size} bytes, not {len(data)}")
    return data


def _integer(size: int, what: str, *, signed: bool = True) -> Callable[[bytes], str]:
    def convert(data: bytes) -> str:
        return str(int.from_bytes(_fixed(size, data, what), "big", signed=signed))
    return convert


def _utf8(data: bytes) -> str:
    return data.decode()  # UnicodeDecodeError is a ValueError


def _jsonb(data: bytes) -> str:
    if not data or data[0] != 1:
        raise ValueError("a binary jsonb does not start with format version 1")
    return data[1:].decode()


def _bool(data: bytes) -> str:
    return "t" if _fixed(1, data, "bool")[0] else "f"


def _bytea(data: bytes) -> str:
    return "\\x" + data.hex()


def _uuid(data: bytes) -> str:
    text = _fixed(16, data, "uuid").hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _date(data: bytes) -> str:
    return format_date(int.from_bytes(_fixed(4, data, "date"), "big", signed=True))


def _time(data: bytes) -> str:
    microseconds = int.from_bytes(_fixed(8, data, "time"), "big", signed=True)
    if not 0 <= microseconds <= 86_400_000_000:
        raise ValueError(f"a binary time of {microseconds} microseconds is out of range")
    return format_time(microseconds)


def _timestamp(data: bytes) -> str:
    return format_timestamp(int.from_bytes(_fixed(8, data, "timestamp"), "big", signed=True),
                            utc_offset=False)


def _timestamptz(data: bytes) -> str:
    return format_timestamp(int.from_bytes(_fixed(8, data, "timestamptz"), "big",
                                           signed=True), utc_offset=True)


def _numeric(data: bytes) -> str:
    if len(data) < 8:
        raise ValueError(f"a binary numeric has at least 8 bytes, not {len(data)}")
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHh", data)
    if ndigits < 0 or len(data) != 8 + 2 * ndigits or dscale < 0:
        raise ValueError(f"a binary numeric's header ({ndigits} digits, scale {dscale}) does "
                         f"not fit its {len(data)} bytes")
    if sign in _NUMERIC_SPECIAL:
        return _NUMERIC_SPECIAL[sign]
    if sign not in _NUMERIC_SIGNS:
        raise ValueError(f"a binary numeric has an unknown sign {sign:#06x}")
    digits = struct.unpack_from(f">{ndigits}H", data, 8)
    if any(digit >= _NBASE for digit in digits):
        raise ValueError("a binary numeric has a base-10000 digit over 9999")

    def group(position: int) -> int:  # the base-10000 digit at a weight position
        index = weight - position
        return digits[index] if 0 <= index < ndigits else 0

    whole = str(group(0)) if weight < 0 else str(group(weight)) + "".join(
        f"{group(p):04d}" for p in range(weight - 1, -1, -1))
    text = _NUMERIC_SIGNS[sign] + whole
    if dscale:
        groups = -(-dscale // 4)
        text += "." + "".join(f"{group(-p):04d}" for p in range(1, groups + 1))[:dscale]
    return text


# -- floats, as float4out and float8out print them (shortest exact, Ryu's layout) ------------
_FLOAT4, _FLOAT8 = struct.Struct(">f"), struct.Struct(">d")


def _float8(data: bytes) -> str:
    value = _FLOAT8.unpack(_fixed(8, data, "float8"))[0]
    special = _special_float(value)
    if special is not None:
        return special
    bits = int.from_bytes(data, "big") & ~(1 << 63)
    low, high = _rounding_interval(abs(value), bits, _FLOAT8)
    digits, exponent = _decimal_parts(repr(abs(value)))  # shortest with inclusive bounds
    candidate = Fraction(Decimal(digits)) * Fraction(10) ** (exponent - len(digits) + 1)
    if not low < candidate < high:  # on a bound, which PostgreSQL's Ryu excludes
        digits, exponent = _shortest_between(abs(value), low, high, 17)
    return _layout(value < 0, digits, exponent, fixed_below=15)


def _float4(data: bytes) -> str:
    value = _FLOAT4.unpack(_fixed(4, data, "float4"))[0]
    special = _special_float(value)
    if special is not None:
        return special
    low, high = _rounding_interval(abs(value), int.from_bytes(data, "big") & ~(1 << 31),
                                   _FLOAT4)
    digits, exponent = _shortest_between(abs(value), low, high, 9)
    return _layout(value < 0, digits, exponent, fixed_below=6)


def _special_float(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    return None


def _decimal_parts(text: str) -> tuple[str, int]:
    """The significant digits of a decimal number (no trailing zeros) and the exponent of
    the first one (scientific notation's)."""
    _, digit_tuple, exponent = Decimal(text).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    return digits, exponent + len(digit_tuple) - 1


def _rounding_interval(value: float, bits: int, layout: struct.Struct) -> tuple[Fraction,
                                                                                 Fraction]:
    """The numbers that round to ``value`` (positive, finite; ``bits`` its IEEE bits): the
    open interval between the midpoints to its neighbours."""
    exact = Fraction(value)
    size = layout.size * 8
    below = Fraction(layout.unpack((bits - 1).to_bytes(layout.size, "big"))[0]) \
        if bits > 1 else Fraction(0)
    infinity = (0x7F800000 if size == 32 else 0x7FF0000000000000)
    above = Fraction(layout.unpack((bits + 1).to_bytes(layout.size, "big"))[0]) \
        if bits + 1 < infinity else exact + (exact - below)
    return (below + exact) / 2, (exact + above) / 2


def _shortest_between(value: float, low: Fraction, high: Fraction, most: int,
                      ) -> tuple[str, int]:
    """The shortest decimal strictly between ``low`` and ``high`` (PostgreSQL builds Ryu
    without STRICTLY_SHORTEST: the bounds are excluded), the closest to ``value`` when
    several are as short (ties to even): its digits and scientific exponent."""
    exact = Fraction(value)
    magnitude = _floor_log10(exact)
    for precision in range(1, most + 1):
        unit = Fraction(10) ** (magnitude - precision + 1)
        first, last = math.floor(low / unit) + 1, math.ceil(high / unit) - 1
        if first <= last:
            k = min(max(round(exact / unit), first), last)
            return _decimal_parts(f"{k}e{magnitude - precision + 1}")
    raise AssertionError(f"no decimal of at most {most} digits reads back as {value!r}")


def _floor_log10(value: Fraction) -> int:
    exponent = math.floor(math.log10(value))
    while Fraction(10) ** exponent > value:
        exponent -= 1
    while Fraction(10) ** (exponent + 1) <= value:
        exponent += 1
    return exponent


def _layout(negative: bool, digits: str, exponent: int, *, fixed_below: int) -> str:
    """Fixed-point when -4 <= exponent < ``fixed_below`` (printf's %g thresholds: 15 for
    float8, 6 for float4), else ``d.ddde+XX`` with at least two exponent digits."""
    sign = "-" if negative else ""
    if -4 <= exponent < fixed_below:
        if exponent < 0:
            return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
        whole = digits[:exponent + 1].ljust(exponent + 1, "0")
        fraction = digits[exponent + 1:]
        return f"{sign}{whole}.{fraction}" if fraction else f"{sign}{whole}"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


_CONVERTERS: dict[int, Callable[[bytes], str]] = {
    BOOL: _bool, BYTEA: _bytea, INT2: _integer(2, "int2"), INT4: _integer(4, "int4"),
    INT8: _integer(8, "int8"), OID: _integer(4, "oid", signed=False),
    TEXT: _utf8, VARCHAR: _utf8, BPCHAR: _utf8, NAME: _utf8, JSON: _utf8, JSONB: _jsonb,
    FLOAT4: _float4, FLOAT8: _float8, NUMERIC: _numeric, UUID: _uuid,
    DATE: _date, TIME: _time, TIMESTAMP: _timestamp, TIMESTAMPTZ: _timestamptz,
}
