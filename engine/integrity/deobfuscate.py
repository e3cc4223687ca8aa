"""Layer C's de-obfuscation: what a text says once the tricks that hide words from a
pattern (but not from a model) are undone.

Applied to the normalised text (Unicode spaces and full-width letters already folded),
it returns the text the rules read: the text itself, then — each on its own line and
only when it differs — a folded view (invisible characters removed, compatibility
forms and look-alike letters folded to Latin, leetspeak and letter-by-letter spelling
joined, whitespace runs as one space) and every encoded segment decoded (base64,
percent-encoding, HTML character references, Unicode tag characters) and folded in
turn, one level of nesting deep. The text itself stays first and unchanged, so rules
that look for the tricks (runs of zero-width characters, tag characters) still see them.

Look-alike letters are folded only where they are disguise: inside a word that also
has Latin letters, or anywhere in a text whose letters are mostly Latin. A Russian or
Greek text keeps its letters, so rules written in those scripts still match it.

Most texts carry none of this: one RE2 pass over the text finds which steps can apply,
and a text that needs none is read as it is, with no second view to scan.
"""

from __future__ import annotations

import base64
import binascii
import html
import itertools
import re
import unicodedata
from urllib.parse import unquote_plus

import re2

MAX_SEGMENTS = 16  # decoded segments per text: bounds the work an adversarial text can cause
MAX_CANDIDATES = 256  # base64-looking runs tried per text
MAX_DECODED_CHARS = 65_536
MIN_ENCODED = 16  # shorter base64 hides too little to carry an instruction

# Format characters a reader does not see (soft hyphen, zero-width, joiners, bidi
# controls, word joiner and invisible operators, the byte-order mark, Hangul fillers).
_INVISIBLE = "[\u00ad\u034f\u061c\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f\u3164\ufeff\uffa0]"
_TAG = "[\U000e0020-\U000e007e]"
# Cyrillic, Greek and Latin-extended letters that render as Latin ones.
_LOOK_ALIKES = "аеорсухіјѕԁһӏԛԝвкмнтАВЕКМНОРСТХІЈЅУαεικνορτυχηβΑΒΕΗΙΚΜΝΟΡΤΥΧΖıɑɡʟ"
_AS_LATIN = str.maketrans(_LOOK_ALIKES, "aeopcyxijsdhlqwbkmhtABEKMHOPCTXIJSYaeikvoptuxnbABEHIKMNOPTYXZiagl")
# Leetspeak: a word with a digit (or @, $) where a letter follows it ("1gn0r3", "4ll";
# not "base64" or "sha256"), folded only where three such words run together, so hex
# and version strings in code are left alone.
_LEET_RUN = r"(?:[A-Za-z]*[0-9@$][A-Za-z][A-Za-z0-9@$]*[\s,.;:!?]+){2}[A-Za-z]*[0-9@$][A-Za-z]"
_LEET = str.maketrans("01345789@$", "oieastbgas")
# Letter-by-letter spelling: four single letters (any script), one separator between.
_LETTER = r"[^\s!-@\[-`{-~]"  # not a space, digit or ASCII punctuation
_SEPARATOR = r"[ .\-_*·/|+]"
_SPELLED_RUN = rf"(?:^|[\s!-@\[-`{{-~]){_LETTER}{_SEPARATOR}{_LETTER}{_SEPARATOR}{_LETTER}{_SEPARATOR}{_LETTER}"
# A run of base64 letters long enough to carry words, with a digit in it (and, for the
# URL-safe alphabet, whose "_" and "-" also join identifiers, a capital as well).
_BASE64_RUN = (
    r"[A-Za-z0-9+/]{15,}[0-9]|[0-9][A-Za-z0-9+/]{15,}|[A-Za-z0-9+/]{6,}[0-9][A-Za-z0-9+/]{6,}"
    r"|[A-Za-z0-9_-]{4,}[A-Z][A-Za-z0-9_-]{0,}[0-9][A-Za-z0-9_-]{4,}|[A-Za-z0-9_-]{4,}[0-9][A-Za-z0-9_-]{0,}[A-Z][A-Za-z0-9_-]{4,}"
)
# Characters whose compatibility form is a plain letter or digit: mathematical
# alphanumerics, enclosed and letter-like symbols, ligatures, super- and subscripts,
# half- and full-width forms. Typographic punctuation (…, µ, ²) is not a disguise.
_COMPATIBILITY = "[\u1d2c-\u1d6a\u2070-\u209f\u2100-\u214f\u2460-\u24ff\u3200-\u33ff\ufb00-\ufb06\uff00-\uffef\U0001d400-\U0001d7ff\U0001f100-\U0001f1ff]"

STEPS = ("invisible", "compatibility", "look_alike", "leet", "spelled", "tag", "percent", "reference", "base64")
TRIGGERS = {  # step -> a pattern found wherever the step can change the text (RE2 syntax)
    "invisible": _INVISIBLE,
    "compatibility": _COMPATIBILITY,
    "look_alike": f"[A-Za-z][{_LOOK_ALIKES}]|[{_LOOK_ALIKES}][A-Za-z]",  # inside a word with Latin letters: a Russian text is not disguise
    "leet": _LEET_RUN,
    "spelled": _SPELLED_RUN,
    "tag": _TAG,
    "percent": r"%[0-9A-Fa-f]{2}[^%]{0,400}%[0-9A-Fa-f]{2}",
    "reference": r"&#(?:[xX][0-9A-Fa-f]{1,6}|[0-9]{1,7});",
    "base64": _BASE64_RUN,
}


def _trigger_set() -> re2.Set:
    found = re2.Set.SearchSet(re2.Options())
    for step in STEPS:
        found.Add(TRIGGERS[step])
    found.Compile()
    return found


_TRIGGER_SET = _trigger_set()
_INVISIBLE_CHARS = re.compile(_INVISIBLE)
_TAGS = re.compile(_TAG + "+")
_WORD = re.compile(r"[^\W\d_]+")
_LATIN = re.compile(r"[A-Za-z]")
_NOT_ASCII_LETTER = bytes(b for b in range(256) if not (65 <= b <= 90 or 97 <= b <= 122))
_GREEK_CYRILLIC_LEADS = (b"\xcd", b"\xce", b"\xcf", b"\xd0", b"\xd1", b"\xd2", b"\xd3")  # U+0340–U+04FF
_LEET_WORD = re.compile(r"(?<![\w@$%])(?=[A-Za-z0-9@$]*[0-9@$][A-Za-z])[A-Za-z0-9@$]{3,20}(?![\w@$])")
_SPELLED = re.compile(r"(?<![^\W_])[^\W\d_](?:(?P<sep>[ .\-_*·/|+])[^\W\d_])(?:(?P=sep)[^\W\d_]){2,}(?![^\W_])")
# Base64 candidates: every byte outside the alphabets becomes a space, then split.
_NOT_BASE64 = bytes(b if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "+/_-") else 32 for b in range(256))


def reading(text: str) -> str:
    """``text`` (normalised) followed by its folded view and decoded segments, each
    on its own line when it adds something."""
    steps = _steps_for(text)
    return read_with(text, steps) if steps else text


def read_with(text: str, steps: frozenset[str]) -> str:
    """``reading`` for a text whose steps are known (the scanner finds them in the same
    RE2 pass as its rules)."""
    views = [text]
    visible = _visible(text, steps)
    folded = _fold_words(visible, steps)
    if folded != text:
        views.append(" ".join(folded.split()))
    budget = MAX_DECODED_CHARS
    for decoded in _decoded(visible, steps, depth=2):
        if budget <= 0:
            break
        decoded = decoded[:budget]
        budget -= len(decoded)
        for view in (decoded, fold(decoded)):
            if view not in views:
                views.append(view)
    return "\n".join(views)


def fold(text: str) -> str:
    """The words a reader sees: invisible characters dropped, compatibility forms
    (mathematical letters, ligatures, circled letters) and look-alikes folded,
    leetspeak and spelled-out words joined, whitespace runs as one space."""
    steps = _steps_for(text)
    return " ".join(_fold_words(_visible(text, steps), steps).split()) if steps else " ".join(text.split())


def _steps_for(text: str) -> frozenset[str]:
    """The steps that can change ``text``, found in one RE2 pass."""
    return frozenset(STEPS[i] for i in _TRIGGER_SET.Match(text.encode()) or ())


def _visible(text: str, steps: frozenset[str]) -> str:
    if "invisible" in steps:
        text = _INVISIBLE_CHARS.sub("", text)
    if "compatibility" in steps:
        text = unicodedata.normalize("NFKC", text)
    return text


def _fold_words(text: str, steps: frozenset[str]) -> str:
    if "look_alike" in steps:
        text = _as_latin(text)
    if "leet" in steps:
        text = _LEET_WORD.sub(lambda m: m.group().translate(_LEET), text)
    if "spelled" in steps:
        text = _SPELLED.sub(lambda m: m.group().replace(m.group("sep"), ""), text)
    return text


def _as_latin(text: str) -> str:
    encoded = text.encode()
    latin = len(encoded.translate(None, _NOT_ASCII_LETTER))
    other = sum(map(encoded.count, _GREEK_CYRILLIC_LEADS))  # one lead byte per letter in UTF-8, counted by C loops
    if latin > other:  # a Latin text with look-alikes in it: every one is disguise
        return text.translate(_AS_LATIN)
    return _WORD.sub(lambda m: m.group().translate(_AS_LATIN) if _LATIN.search(m.group()) else m.group(), text)


def _decoded(text: str, steps: frozenset[str], depth: int) -> list[str]:
    """Encoded segments of ``text``, decoded; ``depth`` levels of nesting."""
    found: list[str] = []
    if "percent" in steps:
        found.append(unquote_plus(text, errors="replace"))
    if "reference" in steps:
        found.append(html.unescape(text))
    if "tag" in steps:
        found.append(" ".join("".join(chr(ord(c) - 0xE0000) for c in run) for run in _TAGS.findall(text)))
    if "base64" in steps:
        for candidate in _base64_candidates(text)[:MAX_CANDIDATES]:
            if len(found) >= MAX_SEGMENTS:
                break
            decoded = _base64_text(candidate)
            if decoded is not None:
                found.append(decoded)
    if depth > 1:
        for segment in list(found):
            inner_steps = _steps_for(segment)
            found += _decoded(_visible(segment, inner_steps), inner_steps, depth - 1) if inner_steps else []
    return found[:MAX_SEGMENTS]


def _base64_candidates(text: str) -> list[str]:
    """Runs of base64 letters long enough to carry words, with both cases and a digit
    or symbol (most identifiers and plain words have not)."""
    runs = text.encode("utf-8", "replace").translate(_NOT_BASE64).split()
    long_runs = itertools.compress(runs, map(MIN_ENCODED.__le__, map(len, runs)))  # C loops: a long text has many words
    return [run.decode() for run in long_runs if not run.isalpha() and run.lower() != run and run.upper() != run]


def _base64_text(candidate: str) -> str | None:
    """The candidate's base64 (standard or URL-safe) decoded, when it is printable text."""
    stripped = candidate.rstrip("=")
    if len(stripped) % 4 == 1:
        return None
    padded = stripped + "=" * (-len(stripped) % 4)
    try:
        raw = base64.urlsafe_b64decode(padded) if ("-" in padded or "_" in padded) else base64.b64decode(padded, validate=True)
        decoded = raw.decode()
    except (binascii.Error, ValueError):
        return None
    if not decoded or not all(c.isprintable() or c in "\n\r\t" for c in decoded):
        return None
    return decoded
