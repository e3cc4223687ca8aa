"""Putting original values back where an answer repeats a placeholder.

Restoring is two steps so the adapter can fetch every mapping it lacks in one round
trip: ``placeholders_in`` lists what a text refers to, ``restore`` replaces what the
caller resolved. A placeholder the caller could not resolve is *missing* and the
caller fails closed; one it chose not to reveal (a token for a principal the policy
does not authorise) it leaves out of ``resolved`` and names in ``keep``.

In a stream a placeholder may be split across events: ``held_from`` says where the
end of a delta might be the start of one, so that much waits for the next delta.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from portcullis.engine.pii.redaction import PLACEHOLDER, PLACEHOLDER_MAX

_PARTIAL = re.compile(r"<(?:[A-Z][A-Z_]*(?:\d+|[0-9a-f]+)?)?")
_PARTIAL_ESCAPE = re.compile(r"\\(?:u(?:0(?:0(?:3[ce]?)?)?)?)?$")


def placeholders_in(text: str, entities: Collection[str]) -> set[str]:
    """The placeholders of ``entities`` a text refers to; ``<STEP_1>`` in an answer
    is not personal data unless STEP is an entity the policy replaces reversibly."""
    if "<" not in text:
        return set()
    return {match.group() for match in PLACEHOLDER.finditer(text) if match.group(1) in entities}


@dataclass(frozen=True)
class Restored:
    text: str
    restored: int
    missing: tuple[str, ...]


def restore(text: str, resolved: Mapping[str, str], entities: Collection[str], keep: Collection[str] = (), json_string: bool = False) -> Restored:
    """``text`` with each resolved placeholder of ``entities`` replaced by its value
    (escaped for the inside of a JSON string when ``json_string``)."""
    if "<" not in text:
        return Restored(text, 0, ())
    count = 0
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        nonlocal count
        placeholder = match.group()
        if match.group(1) not in entities:
            return placeholder
        value = resolved.get(placeholder)
        if value is None:
            if placeholder not in keep:
                missing.append(placeholder)
            return placeholder
        count += 1
        return json.dumps(value, ensure_ascii=False)[1:-1] if json_string else value

    return Restored(PLACEHOLDER.sub(substitute, text), count, tuple(missing))


def held_from(text: str, json_source: bool = False) -> int:
    """Where the tail of ``text`` could still grow into a placeholder (``len(text)``
    when it cannot): the stream keeps that tail back until the next delta. In JSON
    source a trailing start of a ``\\u003e`` escape may be the placeholder's end."""
    end = len(text)
    if json_source:
        escape = _PARTIAL_ESCAPE.search(text, max(0, end - 6))
        end = escape.start() if escape is not None else end
    at = text.rfind("<", max(0, end - PLACEHOLDER_MAX), end)
    return at if at >= 0 and _PARTIAL.fullmatch(text, at, end) is not None else end


def unescape_angles(json_source: str) -> str:
    """JSON written with HTML-safe escapes (Go servers write ``<`` as ``\\u003c``) says
    the same with plain angle brackets, which placeholders are made of."""
    return json_source.replace("\\u003c", "<").replace("\\u003e", ">") if "\\u003" in json_source else json_source
