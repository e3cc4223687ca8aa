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


def placeholders_in(text: str) -> set[str]:
    return {match.group() for match in PLACEHOLDER.finditer(text)} if "<" in text else set()


@dataclass(frozen=True)
class Restored:
    text: str
    restored: int
    missing: tuple[str, ...]


def restore(text: str, resolved: Mapping[str, str], keep: Collection[str] = (), json_string: bool = False) -> Restored:
    """``text`` with each resolved placeholder replaced by its value (escaped for the
    inside of a JSON string when ``json_string``)."""
    if "<" not in text:
        return Restored(text, 0, ())
    count = 0
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        nonlocal count
        placeholder = match.group()
        value = resolved.get(placeholder)
        if value is None:
            if placeholder not in keep:
                missing.append(placeholder)
            return placeholder
        count += 1
        return json.dumps(value, ensure_ascii=False)[1:-1] if json_string else value

    return Restored(PLACEHOLDER.sub(substitute, text), count, tuple(missing))


def held_from(text: str) -> int:
    """Where the tail of ``text`` could still grow into a placeholder (``len(text)``
    when it cannot): the stream keeps that tail back until the next delta."""
    at = text.rfind("<", max(0, len(text) - PLACEHOLDER_MAX))
    if at < 0 or _PARTIAL.fullmatch(text, at) is None:
        return len(text)
    return at
