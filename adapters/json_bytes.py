"""Compact JSON bytes, exactly as ``json.dumps(value, separators=(",", ":"),
ensure_ascii=False)`` writes them (``sort_keys`` too: the audit chain's canonical
form), several times faster.

orjson writes the standard library's bytes for strings, ints, lists, dicts, booleans,
None, and every float Python spells without an exponent: zero and magnitudes in
[1e-4, 1e16) (checked over ten million generated floats). Elsewhere the standard
library writes the value:

- what orjson refuses (an int past 64 bits, a lone surrogate, a key that is not a
  string, nesting past 255 levels) raises TypeError;
- a value holding any other float (``1e-07``, which orjson spells ``1e-7``; ``1e-05``,
  ``0.00001``; NaN and infinities, which orjson writes as ``null``). The floats are found
  in the value's msgpack form (msgspec, ~1 µs): each is the byte 0xcb and its eight
  bytes. A 0xcb inside a string or an int only adds a look, never hides a float.

``parse`` is the reverse: ``json.loads``'s value, read by orjson where the two agree.
orjson refuses what only the standard library accepts (NaN and infinities, numbers
past a double's range, lone surrogates, a byte-order mark, UTF-16): those are read by
the standard library. The one silent difference, an integer past 64 bits read as a
float, is ruled out by reading any document with a run of 19 or more digits the slow way.

``tests/test_unit_json_bytes.py`` checks byte-equality over generated values.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import msgspec
import orjson

_SORTED = orjson.OPT_SORT_KEYS
# Types json cannot write: orjson refuses them too, so the fallback raises as json did.
_PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_MSGPACK = msgspec.msgpack.Encoder()
_FLOAT64 = b"\xcb"  # msgpack's tag of a float64, whose eight big-endian bytes follow
_DOUBLE = struct.Struct(">d")
_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # 64-bit integers have at most 19 digits before the 20-digit unsigned ones


def compact(value: Any, sort_keys: bool = False) -> bytes:
    """``value`` as the standard library's compact, UTF-8 JSON (keys sorted if asked)."""
    try:
        written = orjson.dumps(value, option=_PLAIN | _SORTED if sort_keys else _PLAIN)
    except TypeError:
        return _standard(value, sort_keys)
    if not _floats_spelled_alike(value):
        return _standard(value, sort_keys)
    return written


def parse(raw: bytes) -> Any:
    """``json.loads(raw)``: the same value, or the same ``ValueError``."""
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # perhaps something only the standard library reads: it decides
    return json.loads(raw)


def _standard(value: Any, sort_keys: bool) -> bytes:
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode()


def _floats_spelled_alike(value: Any) -> bool:
    """True when every float in ``value`` is one both encoders spell alike."""
    try:
        packed = _MSGPACK.encode(value)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):  # a str subclass, say: decided the slow way
        return False
    at = packed.find(_FLOAT64)
    while at >= 0:
        if at + 9 > len(packed):
            return False
        number = _DOUBLE.unpack_from(packed, at + 1)[0]
        if not (number == 0.0 or 1e-4 <= abs(number) < 1e16):  # NaN fails every comparison
            return False
        at = packed.find(_FLOAT64, at + 1)
    return True
