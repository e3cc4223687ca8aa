"""``printable`` (engine/errors.py) reads a name with one regex match; it accepts exactly
the names the per-character definition accepts."""

from __future__ import annotations

import sys

from portcullis.engine.errors import _PERSONAL_LOOKING, printable


def by_character(name: object) -> str:
    text = name if isinstance(name, str) else ""
    if 0 < len(text) <= 128 and all(ch.isalnum() or ch in "._:/@-[]" for ch in text) and not _PERSONAL_LOOKING.search(text):
        return text
    return "<unprintable name>"


def test_every_character_is_judged_as_before() -> None:
    for code in range(sys.maxunicode + 1):
        name = f"m{chr(code)}1"
        assert printable(name) == by_character(name), hex(code)


def test_lengths_types_and_personal_looking_names() -> None:
    for name in ["", "a" * 128, "a" * 129, "gpt-4o-mini", "claude-opus-4-8[1m]", "x\n", "a@b.com", "call 0123456789", None, 42, "_under_score_"]:
        assert printable(name) == by_character(name)
