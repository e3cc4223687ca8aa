"""adapters/json_bytes.py writes exactly the bytes json.dumps writes (compact, UTF-8,
keys sorted when asked): the audit chain's canonical form does not change, so every
log written before still verifies and every record written now verifies the old way."""

from __future__ import annotations

import json
import math
import random
import struct
import sys

import pytest

from portcullis.adapters.json_bytes import compact, parse
from portcullis.engine.audit_chain import canonical, seal, verify


def standard(value: object, sort_keys: bool) -> bytes:
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode()


SPECIAL_FLOATS = [
    0.0,
    -0.0,
    1.0,
    0.1,
    1e-4,
    9.9999e-5,
    1e-5,
    1e-7,
    5e-324,
    1e15,
    9999999999999998.0,
    1e16,
    1.7976931348623157e308,
    math.nan,
    math.inf,
    -math.inf,
]
SPECIAL_INTS = [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**30]
STRINGS = [
    "",
    "plain",
    "é ü 日本 😀",
    "\x00\x01\x1f\x7f\x80\x9f",
    '"quoted" \\ back',
    "\n\r\t\b\f",
    "\u2028\u2029",
    "\ufeff",
    "re-run e+5 0.0000 null",
    "\ud800",
    "a\udfffb",
]


class Text(str):
    pass


class Count(int):
    pass


class Members(dict):  # like jsonbody.Inserted
    pass


def random_float(rng: random.Random) -> float:
    choice = rng.random()
    if choice < 0.3:
        return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
    if choice < 0.6:
        return rng.uniform(-1, 1) * 10 ** rng.uniform(-8, 18)
    if choice < 0.8:
        return round(rng.uniform(0, 1e5), rng.randrange(0, 7))
    return rng.choice(SPECIAL_FLOATS)


def random_string(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice(STRINGS)
    return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x110000)])) for _ in range(rng.randrange(0, 8)))


def random_value(rng: random.Random, depth: int = 0) -> object:
    choice = rng.random()
    if depth < 4 and choice < 0.25:
        keys = [random_string(rng) for _ in range(rng.randrange(0, 6))]
        if rng.random() < 0.05:
            keys.append(rng.choice([1, 2.5, None, True]))  # not a string: json converts it, orjson refuses
        made = {key: random_value(rng, depth + 1) for key in keys}
        return Members(made) if rng.random() < 0.1 else made
    if depth < 4 and choice < 0.4:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    if choice < 0.55:
        return random_string(rng) if rng.random() < 0.9 else Text(random_string(rng))
    if choice < 0.7:
        return rng.choice(SPECIAL_INTS) if rng.random() < 0.3 else (Count(rng.randrange(-1000, 1000)) if rng.random() < 0.1 else rng.randrange(-(10**6), 10**6))
    if choice < 0.85:
        return random_float(rng)
    return rng.choice([None, True, False])


def outcome(encode, value: object, sort_keys: bool) -> bytes | str:
    try:
        return encode(value, sort_keys)
    except (TypeError, ValueError, UnicodeEncodeError) as error:  # what json refuses, compact refuses alike
        return type(error).__name__


@pytest.mark.parametrize("seed", range(6))
def test_the_same_bytes_as_json_over_generated_values(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(6000):
        value = random_value(rng)
        for sort_keys in (False, True):
            assert outcome(compact, value, sort_keys) == outcome(standard, value, sort_keys), repr(value)


@pytest.mark.parametrize(
    "value", [*SPECIAL_FLOATS, *SPECIAL_INTS, *STRINGS, {"b": 1, "a": 2, "é": 3, "Z": 4, "😀": 5, "\uffff": 6}, {1: 2}, {"x": (1, 2)}, [[[[]]]]]
)
def test_the_same_bytes_on_the_edges(value: object) -> None:
    for sort_keys in (False, True):
        assert outcome(compact, value, sort_keys) == outcome(standard, value, sort_keys)


def test_floats_orjson_spells_otherwise_are_always_caught() -> None:
    # Every float where the two spell differently carries one of the markers compact looks for.
    rng = random.Random(11)
    for _ in range(200_000):
        number = random_float(rng)
        assert compact({"x": number}) == standard({"x": number}, False)


def test_deep_nesting_is_the_standard_librarys_to_refuse() -> None:
    deep: object = 1
    for _ in range(300):  # past orjson's 255 levels
        deep = [deep]
    assert compact(deep) == standard(deep, False)
    assert sys.getrecursionlimit() > 300


def test_a_chain_sealed_with_compact_verifies_with_the_canonical_form() -> None:
    rng = random.Random(5)
    lines, prev = [], "0" * 64
    for _ in range(300):
        seq = len(lines) + 1
        record = {"event": "x", "value": random_value(rng)}
        try:
            line, prev = seal(record, seq, prev, lambda r: compact(r, sort_keys=True))
        except (TypeError, ValueError, UnicodeEncodeError):
            with pytest.raises((TypeError, ValueError, UnicodeEncodeError)):
                canonical({**record, "seq": seq, "prev": prev})
            continue
        lines.append(line)
    # Records whose values json reads back differently (NaN, non-str keys) still verify: canonical reads the written line.
    result = verify(lines)
    assert result.ok, result.problem
    assert result.records == len(lines) > 200


def read(loads, raw: bytes) -> str:
    """What a reader makes of ``raw``: the value's repr (floats and types included) or the error's type."""
    try:
        return repr(loads(raw))
    except (ValueError, RecursionError) as error:
        return type(error).__name__


PARSE_EDGES = [
    b'{"a":1e400}',  # infinity: only the standard library reads it
    b"[NaN, -Infinity]",
    b'{"a":123456789012345678901234567890}',  # past 64 bits: orjson would read a float
    b'{"a":-9223372036854775809}',
    b'{"a":18446744073709551615}',
    b'{"a":"\\ud800"}',  # a lone surrogate
    b'\xef\xbb\xbf{"a":1}',  # a byte-order mark
    '{"a":"é"}'.encode("utf-16"),
    b'{"a":"\xff"}',  # not UTF-8
    b'{"a":1,"a":2}',  # the last member wins in both
    b'{"a":-0.0,"b":2.5e-324,"c":1e-400}',
    b'  {"a":"\\u0000"}\n ',
    b'{"a":1} x',
    b"",
    b"[" * 2000 + b"]" * 2000,
]


@pytest.mark.parametrize("raw", PARSE_EDGES)
def test_parse_reads_what_json_reads_on_the_edges(raw: bytes) -> None:
    assert read(parse, raw) == read(json.loads, raw)


@pytest.mark.parametrize("seed", range(3))
def test_parse_reads_what_json_reads_over_generated_documents(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(4000):
        try:
            raw = standard(random_value(rng), False)
        except (TypeError, ValueError, UnicodeEncodeError):
            continue
        assert read(parse, raw) == read(json.loads, raw), raw
