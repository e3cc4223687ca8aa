"""Layer C's scanner: the bundle's injection rules compiled once into one RE2 set, so
a text is read in a single pass whatever the number of rules.

The Rego rule ``data.portcullis.injection_scan`` defines the same result and is what
policy tests exercise; this is its fast path (regorus evaluates each rule per text,
~100 µs of overhead a text). Both read the same patterns, and the gateway's tests
check that they agree. RE2 and Rust's regex share their syntax but RE2's ``\\s`` is
ASCII-only, so for RE2 every ``\\s``/``\\S`` is widened to Unicode spaces when the set
is compiled: a model reads a no-break space as a space, and so must the rules. Both
paths read full-width letters as ASCII (``normalise``); invisible format characters
(zero-width, tag characters) are kept, since rules look for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import re2

from portcullis.engine.integrity.injection import ScanResult

_HALF_WIDTH = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
_FULL_WIDTH = re2.compile("[\uff01-\uff5e]")


class ScannerError(ValueError):
    """A rule's pattern that RE2 cannot compile."""


class Scanner:
    def __init__(self, rules: Sequence[Mapping[str, Any]]) -> None:
        self._ids = [rule["id"] for rule in rules]
        self._weights = [int(rule["weight"]) for rule in rules]
        options = re2.Options()
        options.max_mem = 64 << 20  # the set's automaton; the default 8 MiB is too small for a few dozen rules
        self._set = re2.Set.SearchSet(options) if rules else None
        for rule in rules:
            try:
                self._set.Add(unicode_spaces(rule["pattern"]))  # type: ignore[union-attr]
            except re2.error:
                raise ScannerError(f"integrity rule {rule['id']!r}: RE2 cannot compile its pattern") from None
        if self._set is not None:
            self._set.Compile()

    def scan(self, text: str) -> ScanResult:
        if self._set is None:
            return ScanResult((), 0)
        matched = sorted(self._set.Match(normalise(text).encode("utf-8", "replace")) or ())  # "replace": RE2 reads UTF-8, a lone surrogate is not
        return ScanResult(tuple(self._ids[i] for i in matched), sum(self._weights[i] for i in matched))


def normalise(text: str) -> str:
    """What both paths read: full-width letters and signs as ASCII."""
    if text.isascii() or not _FULL_WIDTH.search(text):
        return text
    return text.translate(_HALF_WIDTH)


def unicode_spaces(pattern: str) -> str:
    """``\\s`` and ``\\S`` as Rust's regex means them (Unicode), in RE2's syntax."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escape = pattern[i : i + 2]
            if escape == "\\s":
                out.append("\\s\\p{Z}" if in_class else "[\\s\\p{Z}]")
            elif escape == "\\S" and not in_class:
                out.append("[^\\s\\p{Z}]")
            else:
                out.append(escape)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                out.append("[^")
                i += 2
                if pattern[i : i + 1] == "]":  # a literal "]" first in a class
                    out.append("]")
                    i += 1
                continue
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)
