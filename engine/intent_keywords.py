"""The bundle's keyword sets matched against a task's text, in one bounded pass.

Keyword sets live in bundle data (``data.portcullis.intent.keyword_sets``: a name and
its words or phrases); only the names of the sets a text matches reach the policy,
never the text. Matching is case-insensitive (Unicode lower-casing of text and keyword)
on word-ish boundaries: a keyword's words may be separated by any run of spaces or
punctuation (``zero-downtime`` matches ``zero downtime``), and a keyword whose end is a
letter or digit of a script that separates words with spaces must not run on into
another letter there (``test`` does not match ``latest``), while one ending in Chinese,
Japanese or Korean script may (``設計`` in ``システム設計を``, ``설계`` in ``설계를``), since
those scripts attach particles or write no spaces. A trailing ``*`` lets a keyword
continue into any word (``migrat*``: migrate, migration).

Every keyword of every set is one RE2 set, matched once over at most ``MAX_CHARS``
characters: linear time, whatever the text or the sets. A boundary is ASCII
punctuation or space, or a character of the common Unicode punctuation blocks (Latin-1
signs, General Punctuation, CJK punctuation, full-width ASCII signs): a small class,
so a few hundred keywords compile into about a megabyte. A rarer sign next to a keyword
reads as a letter, and that keyword is missed rather than matched wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import re2

MAX_CHARS = 4096  # of the task's text: the ask is at its start; a pasted log after it adds nothing
_BOUNDARY = r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f\x{80}-\x{BF}\x{2000}-\x{206F}\x{3000}-\x{303F}\x{FF01}-\x{FF20}]"
_WORDS = re.compile(r"[\W_]+")


class KeywordError(ValueError):
    pass


def _spaced(char: str) -> bool:
    """Whether a keyword ending in ``char`` needs a boundary there: letters and digits
    of scripts before the CJK blocks (Latin, Greek, Cyrillic, Arabic, Hebrew, Indic...)."""
    return char.isalnum() and ord(char) < 0x2E80


def keyword_pattern(keyword: str) -> str:
    """The RE2 pattern for one keyword, over lower-cased text."""
    stripped = keyword.strip()
    open_end = stripped.endswith("*")
    words = [word for word in _WORDS.split(stripped.rstrip("*").lower()) if word]
    if not words:
        raise KeywordError(f"keyword {keyword!r} has no letter or digit")
    body = f"{_BOUNDARY}+".join(re2.escape(word) for word in words)
    before = f"(?:^|{_BOUNDARY})" if _spaced(words[0][0]) else ""
    after = f"(?:{_BOUNDARY}|$)" if _spaced(words[-1][-1]) and not open_end else ""
    return before + body + after


class KeywordMatcher:
    """Which of the sets a text matches. Built once per bundle."""

    def __init__(self, keyword_sets: Mapping[str, Sequence[str]]) -> None:
        self._owners: list[str] = []  # the set each pattern index belongs to
        self._set = re2.Set.SearchSet(re2.Options())
        for name, keywords in keyword_sets.items():
            for keyword in keywords:
                if self._set.Add(keyword_pattern(keyword)) != len(self._owners):
                    raise KeywordError(f"keyword {keyword!r} of set {name!r} does not compile")
                self._owners.append(name)
        self._empty = not self._owners
        if not self._empty:
            try:
                self._set.Compile()
            except re2.error:
                raise KeywordError("the keyword sets are too large to compile together") from None

    def matched(self, texts: Sequence[str]) -> list[str]:
        """The sorted names of the sets any of ``texts`` (read up to MAX_CHARS in all) matches."""
        if self._empty:
            return []
        bounded, left = [], MAX_CHARS
        for text in texts:
            if left <= 0:
                break
            bounded.append(text[:left])
            left -= len(bounded[-1])
        hits = self._set.Match("\n".join(bounded).lower()) or ()  # None: no set matched
        return sorted({self._owners[index] for index in hits})


NO_KEYWORDS = KeywordMatcher({})
