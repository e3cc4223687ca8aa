"""Layer C's scanner: the bundle's injection rules compiled once into one RE2 set, so
a text is read in a single pass whatever the number of rules.

The Rego rule ``data.portcullis.injection_scan`` defines the same result and is what
policy tests exercise; this is its fast path (regorus evaluates each rule per text,
~100 µs of overhead a text). Both read the same patterns over the same normalised
text, and the gateway's tests check that they agree. Normalising closes the gap where
the two engines differ on whitespace (RE2's ``\\s`` is ASCII-only), with the folding
the PII recognisers use too (``engine.textfold``): every Unicode space, vertical tab
and next-line becomes " ", since a model reads them as spaces; dashes become "-";
full-width letters become ASCII. Invisible format characters (zero-width, tag
characters) are kept: rules look for them. The bundle's rules write word boundaries
as explicit ASCII classes rather than ``\\b``/``\\w``, which the engines read differently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import re2

from portcullis.engine import textfold
from portcullis.engine.integrity.deobfuscate import STEPS, TRIGGERS, read_with, reading
from portcullis.engine.integrity.injection import ScanResult


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
    """The text as the rules read it, as UTF-8: the detectors' shared folding."""
    return textfold.fold_utf8(text)


def normalise(text: str) -> str:
    """The same, as text: what the Rego reference is given."""
    return textfold.fold(text)


def rules_read(text: str) -> str:
    """What the rules match against: the normalised text and what de-obfuscation finds
    in it. The Rego reference is given exactly this."""
    return reading(normalise(text))
