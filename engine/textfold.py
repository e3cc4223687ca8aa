"""Text as the detectors read it: one folding shared by the PII recognisers and the
injection scanner, so both see the same characters.

``fold`` maps character for character (positions do not move):

- every Unicode space separator (U+00A0 no-break, U+2007 figure, U+2009 thin, U+202F
  narrow no-break, U+3000 ideographic, the rest of category Zs), the line and
  paragraph separators, vertical tab and next-line become " ": a model and a
  reader see a space, and numbers are grouped with them (``4111 1111 …``);
- the dashes (U+2010–U+2015, minus sign, small and full-width hyphen-minus) become
  "-": ``412‑55‑7391`` with non-breaking hyphens is the same number;
- full-width forms (U+FF01–U+FF5E: ``ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ``, ``０９０－１２３４``) become
  their ASCII letters, digits and punctuation;
- the long s (U+017F) and the Kelvin sign (U+212A) become "s" and "K": case-insensitive
  RE2 matches them as those letters while its ASCII classes call them non-letters, so
  a rule would read ``ſtop`` as a letter in one place and a boundary in the next;
- a lone surrogate (which RE2, reading UTF-8, cannot take) becomes U+FFFD.

``fold_mapped`` also decodes the percent-escapes of the characters an e-mail address
is made of (``jane.doe%40example.com``), which shortens the text; its ``span`` maps a
position in the folded text back to the original, so a transform replaces exactly the
original characters and leaves every other byte as it was.

Invisible format characters (zero-width, tags) are kept: the injection rules look for
them, and removing them is a de-obfuscation layer of its own.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

import re2

SPACES = "\x0b\x85\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
DASHES = "\u2010-\u2015\u2212\ufe58\ufe63"
FULL_WIDTH = "\uff01-\uff5e"
CASE_FOLDED = "\u017f\u212a"

_TABLE: dict[int, int] = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
_TABLE.update({code: 0x20 for code in (0x0B, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)})
_TABLE.update({code: 0x2D for code in (*range(0x2010, 0x2016), 0x2212, 0xFE58, 0xFE63)})
_TABLE.update({0x017F: 0x73, 0x212A: 0x4B})
# Each group is looked for by RE2 on UTF-8 (linear, a few ns a byte); only a group that
# is there is replaced, one str.replace per character of it the text holds. That is
# 5–10× cheaper than str.translate (~60–140 ns a character) when folding is sparse (an em
# dash in a comment) and no dearer when it is dense (Japanese full-width punctuation).
_GROUPS = tuple(
    (re2.compile(f"[{characters}]".encode()), tuple((chr(code), chr(_TABLE[code])) for code in sorted(_TABLE) if re.fullmatch(f"[{characters}]", chr(code))))
    for characters in (SPACES, DASHES, FULL_WIDTH, CASE_FOLDED)
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# What a percent-escape may stand for inside an e-mail address: "@", ".", "+", "-", "_".
_EMAIL_ESCAPE = re.compile("%(?:40|2[BbDdEe]|5[Ff])")
_ESCAPED = {"40": "@", "2B": "+", "2D": "-", "2E": ".", "5F": "_"}


def fold(text: str) -> str:
    """``text`` folded character for character (see the module's description)."""
    if text.isascii():
        return text.replace("\x0b", " ") if "\x0b" in text else text
    try:
        encoded = text.encode()
    except UnicodeEncodeError:
        text = _LONE_SURROGATE.sub("\ufffd", text)
        encoded = text.encode()
    for present, characters in _GROUPS:
        if present.search(encoded) is not None:
            for character, folded in characters:
                if character in text:
                    text = text.replace(character, folded)
    return text


def fold_utf8(text: str) -> bytes:
    """``fold(text)`` as UTF-8, what an RE2 set matches against."""
    return fold(text).encode()


@dataclass(frozen=True)
class Folded:
    """A folded text and where its characters came from: ``decoded`` holds, in order,
    the folded positions of characters that were a three-character escape."""

    text: str
    decoded: tuple[int, ...] = ()

    def position(self, at: int) -> int:
        """The original position of folded position ``at`` (a span's start or end)."""
        return at + 2 * bisect_left(self.decoded, at) if self.decoded else at

    def span(self, start: int, end: int) -> tuple[int, int]:
        return self.position(start), self.position(end)


def fold_mapped(text: str) -> Folded:
    """``fold(text)`` with the e-mail characters' percent-escapes decoded, mapped back."""
    folded = fold(text)
    if "%" not in folded:
        return Folded(folded)
    pieces: list[str] = []
    decoded: list[int] = []
    at = 0
    length = 0
    for match in _EMAIL_ESCAPE.finditer(folded):
        pieces.append(folded[at : match.start()])
        length += match.start() - at
        decoded.append(length)
        pieces.append(_ESCAPED[match.group()[1:].upper()])
        length += 1
        at = match.end()
    if not decoded:
        return Folded(folded)
    pieces.append(folded[at:])
    return Folded("".join(pieces), tuple(decoded))
