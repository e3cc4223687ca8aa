"""Layer C's scanner: the bundle's injection rules compiled once into one RE2 set, so
a text is read in a single pass whatever the number of rules.

The Rego rule ``data.portcullis.injection_scan`` defines the same result and is what
policy tests exercise; this is its fast path (regorus evaluates each rule per text,
~100 µs of overhead a text). Both read the same patterns over the same normalised
text, and the gateway's tests check that they agree. Normalising closes the gap where
the two engines differ on whitespace (RE2's ``\\s`` is ASCII-only): every Unicode
space, vertical tab and next-line becomes " ", since a model reads them as spaces;
full-width letters become ASCII. Invisible format characters (zero-width, tag
characters) are kept: rules look for them. ``\\w`` and ``\\b`` stay ASCII in RE2, which
the bundle's rules are written for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import re2

from portcullis.engine.integrity.deobfuscate import STEPS, TRIGGERS, read_with, reading
from portcullis.engine.integrity.injection import ScanResult

_HALF_WIDTH = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
_FULL_WIDTH = re2.compile("[\uff01-\uff5e]".encode())
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Unicode's separators (category Z) other than " ", and the vertical tab and next-line.
_SPACES = re2.compile(rb"[\x{0B}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]")
_SPACE_CHARS = re.compile("[\x0b\x85\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


class ScannerError(ValueError):
    """A rule's pattern that RE2 cannot compile."""


class Scanner:
    """``deobfuscate``: whether the rules also read what obfuscation hid (on by
    default; off only to measure what the layer adds). The de-obfuscation steps'
    triggers sit in the same RE2 set after the rules: a text that needs no step (most
    texts) is still read in one pass, one that does is read again with its views."""

    def __init__(self, rules: Sequence[Mapping[str, Any]], deobfuscate: bool = True) -> None:
        self._ids = [rule["id"] for rule in rules]
        self._weights = [int(rule["weight"]) for rule in rules]
        self._triggers = STEPS if deobfuscate and rules else ()
        options = re2.Options()
        options.max_mem = 64 << 20  # the set's automaton; the default 8 MiB is too small for a few dozen rules
        self._set = re2.Set.SearchSet(options) if rules else None
        for rule in rules:
            try:
                self._set.Add(rule["pattern"])  # type: ignore[union-attr]
            except re2.error:
                raise ScannerError(f"integrity rule {rule['id']!r}: RE2 cannot compile its pattern") from None
        for step in self._triggers:
            self._set.Add(TRIGGERS[step])  # type: ignore[union-attr]
        if self._set is not None:
            self._set.Compile()

    def scan(self, text: str) -> ScanResult:
        if self._set is None:
            return ScanResult((), 0)
        data = normalised_utf8(text)
        rules = len(self._ids)
        matched = self._set.Match(data) or ()
        steps = frozenset(self._triggers[i - rules] for i in matched if i >= rules)
        if steps:  # read again: the text and what de-obfuscation found in it
            matched = self._set.Match(read_with(data.decode(), steps).encode()) or ()
        hits = sorted(i for i in matched if i < rules)
        return ScanResult(tuple(self._ids[i] for i in hits), sum(self._weights[i] for i in hits))


def normalised_utf8(text: str) -> bytes:
    """The text as the rules read it, as UTF-8 (a lone surrogate as U+FFFD)."""
    if text.isascii():
        return text.encode().replace(b"\x0b", b" ")  # RE2's \s lacks the vertical tab
    try:
        encoded = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: RE2 reads UTF-8, which it is not
        text = _LONE_SURROGATE.sub("\ufffd", text)
        encoded = text.encode()
    if _FULL_WIDTH.search(encoded):
        text = text.translate(_HALF_WIDTH)
        encoded = text.encode()
    if _SPACES.search(encoded) is None:  # found by RE2 on bytes; rare, so replaced by Python's re
        return encoded
    return _SPACE_CHARS.sub(" ", text).encode()


def normalise(text: str) -> str:
    """The same, as text: what the Rego reference is given."""
    return normalised_utf8(text).decode() if not text.isascii() or "\x0b" in text else text


def rules_read(text: str) -> str:
    """What the rules match against: the normalised text and what de-obfuscation finds
    in it. The Rego reference is given exactly this."""
    return reading(normalise(text))
