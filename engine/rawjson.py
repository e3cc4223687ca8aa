"""Byte-preserving edits of a JSON request body.

When the gateway forwards a body in the client's own protocol it must change as
little as possible: provider prompt caches key on content and order (seed §2.3), and
operators diff what went upstream against what the client sent. ``set_member``
replaces or adds one top-level member and leaves every other byte untouched.
"""

from __future__ import annotations

import json
import re
from typing import Any

_scan = json.JSONDecoder().scan_once  # the C scanner: returns (value, end index)
_SPACE = re.compile(r"[ \t\r\n]*")


class RawJsonError(ValueError):
    """The body is not a JSON object this module can edit in place."""


def set_member(raw: bytes, key: str, value: Any) -> bytes:
    """``raw`` with top-level member ``key`` set to ``value``."""
    text = raw.decode("utf-8")
    encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    spans, opening = _member_value_spans(text, key)
    if spans:
        # Every occurrence: with a duplicated key, the upstream parser must not see a
        # value the gateway never decided on.
        for start, end in reversed(spans):
            text = text[:start] + encoded + text[end:]
        return text.encode("utf-8")
    after = _skip(text, opening + 1)
    separator = "" if text[after : after + 1] == "}" else ","
    member = json.dumps(key) + ":" + encoded + separator
    return (text[: opening + 1] + member + text[opening + 1 :]).encode("utf-8")


def _member_value_spans(text: str, key: str) -> tuple[list[tuple[int, int]], int]:
    """Spans of every value of top-level member ``key``, and the opening brace's index."""
    opening = _skip(text, 0)
    if text[opening : opening + 1] != "{":
        raise RawJsonError("body is not a JSON object")
    spans: list[tuple[int, int]] = []
    i = _skip(text, opening + 1)
    if text[i : i + 1] == "}":
        return spans, opening
    try:
        while True:
            name, i = _scan(text, i)
            i = _skip(text, i)
            if text[i : i + 1] != ":":
                raise RawJsonError("malformed object member")
            start = _skip(text, i + 1)
            _, end = _scan(text, start)
            if name == key:
                spans.append((start, end))
            i = _skip(text, end)
            if text[i : i + 1] == ",":
                i = _skip(text, i + 1)
            elif text[i : i + 1] == "}":
                return spans, opening
            else:
                raise RawJsonError("malformed object")
    except StopIteration:
        raise RawJsonError("malformed JSON value") from None


def _skip(text: str, i: int) -> int:
    match = _SPACE.match(text, i)
    return match.end() if match else i
