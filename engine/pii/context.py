"""Context: the label that makes an unformatted number an identifier.

Nine bare digits are a ticket number until a text calls them an SSN; a Korean RRN
issued since October 2020 has no check digit, so only its label tells it from any
other thirteen digits. As Presidio's context words do, a label raises a candidate the
pattern layer would not report alone to a finding. A label counts where a reader
would take it as one:

- *inline*: before the value on the same line, separated by at most a few words
  and punctuation, no digit and no sentence break (``SSN: 412557391``,
  ``주민등록번호는 2102113136158입니다``, ``"ssn": "412557391"``);
- *a table's column*: a header cell of a comma, tab, semicolon or pipe separated
  block, when the value is the whole cell below it in the same column;
- *a JSON member's name*: ``{"ssn": 412557391}``, when the value is the member's
  whole value (``MemberValue`` carries the name to the detector).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

# The words that label each type, in the languages the gateway's users write. Matched
# case-insensitively; an ASCII label must not be glued to letters ("ISSN" is no SSN).
LABELS: dict[str, tuple[str, ...]] = {
    "US_SSN": ("ssn", "ssns", "social security", "soc. sec.", "seguro social", "sécurité sociale", "securite sociale", "사회보장번호", "社会保障番号"),
    "KR_RRN": ("주민등록번호", "주민번호", "rrn", "resident registration"),
    "IBAN": ("iban",),
}

# The labels as an RE2-compatible alternation (no lookarounds): the scanner's trigger.
TRIGGER = "(?i:" + "|".join(re.escape(word).replace("\\ ", "[ _-]?") for words in LABELS.values() for word in words) + ")"
_ENTITY_OF = {word.replace(" ", "").replace(".", ""): entity for entity, words in LABELS.items() for word in words}
_ASCII_LETTER = re.compile("[A-Za-z]")
# Between a label and its value: a few words and punctuation, no digit, no line or
# sentence break; after a ":" or "=" only spaces and quotes (``ssn_ok=true id=…``: the
# label has its own value).
_GAP = re.compile(r"[^\d\n;。!?:=：]{0,40}(?:[:=：][\s\"'`]*)?")
_WORD = re.compile(r"[A-Za-z\u00c0-\u024f]+")
_GAP_WORDS = 4
_MAX_COLUMNS = 8  # header cells looked for per text: each one reads its block once
_DELIMITERS = (",", "\t", ";", "|")
_CELL_PADDING = " \"'*"
_MAX_HEADER_CELL = 40


class MemberValue(str):
    """A string that is the value of a JSON member, with the member's name as context."""

    member: str

    def __new__(cls, value: str, member: str) -> MemberValue:
        text = super().__new__(cls, value)
        text.member = member
        return text


def label_entity(word: str) -> str | None:
    """The entity type a matched label word names."""
    return _ENTITY_OF.get(re.sub(r"[ _.-]", "", word.lower()))


def member_entities(member: str | None) -> frozenset[str]:
    """The types a JSON member's name labels (``customer_ssn``, ``IBAN``, ``rrn``)."""
    if not member:
        return frozenset()
    words = re.sub(r"([a-z])([A-Z])", r"\1 \2", member)
    return frozenset(entity for start, end, entity in _labels_in(words))


def names_a_type(text: str) -> bool:
    """Whether ``text`` is a member's value whose name labels an entity type."""
    return isinstance(text, MemberValue) and bool(member_entities(text.member))


def _labels_in(text: str) -> list[tuple[int, int, str]]:
    found = []
    for match in re.finditer(TRIGGER, text):
        entity = label_entity(match.group())
        if entity is not None and _standalone(text, match.start(), match.end()):
            found.append((match.start(), match.end(), entity))
    return found


def _standalone(text: str, start: int, end: int) -> bool:
    if not _ASCII_LETTER.match(text, start):
        return True  # Hangul and kana labels take particles straight after them
    before = text[start - 1] if start else ""
    after = text[end] if end < len(text) else ""
    return not (before.isascii() and before.isalpha()) and not (after.isascii() and after.isalpha() and after != "s")


@dataclass(frozen=True)
class _Column:
    entity: str
    delimiter: str
    index: int
    rows: tuple[int, int]  # where the block's rows below the header start and end


@dataclass
class Labels:
    """The labels of one text, gathered as the scan passes them (a label always comes
    before the value it names)."""

    text: str
    member: frozenset[str] = frozenset()
    _ends: dict[str, list[int]] = field(default_factory=dict)
    _columns: list[_Column] = field(default_factory=list)

    def add(self, start: int, end: int) -> str | None:
        """Records a label the scan met; returns its entity type (None if it is no label)."""
        entity = label_entity(self.text[start:end])
        if entity is None or not _standalone(self.text, start, end):
            return None
        self._ends.setdefault(entity, []).append(end)
        column = _column_of(self.text, start, end, entity) if len(self._columns) < _MAX_COLUMNS else None
        if column is not None:
            self._columns.append(column)
        return entity

    def any(self, entity: str) -> bool:
        return entity in self.member or entity in self._ends or any(c.entity == entity for c in self._columns)

    def names(self, entity: str, start: int, end: int) -> bool:
        """Whether ``text[start:end]`` is labelled as ``entity``."""
        text = self.text
        if entity in self.member and not text[:start].strip() and not text[end:].strip():
            return True
        ends = self._ends.get(entity, ())
        at = bisect_right(ends, start) - 1
        if at >= 0 and _GAP.fullmatch(text, ends[at], start) and len(_WORD.findall(text, ends[at], start)) <= _GAP_WORDS:
            return True
        return any(c.entity == entity and c.rows[0] <= start < c.rows[1] and _in_column(text, start, end, c) for c in self._columns)


def _column_of(text: str, start: int, end: int, entity: str) -> _Column | None:
    """The table column a label heads, when it is a short cell of a delimited line.
    Searches with bounds rather than slices: a minified document is one long line."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    for delimiter in _DELIMITERS:
        if text.find(delimiter, line_start, line_end) < 0:
            continue
        cell_start = text.rfind(delimiter, line_start, start) + 1 or line_start
        cell_end = text.find(delimiter, end, line_end)
        cell_end = line_end if cell_end < 0 else cell_end
        if cell_end - cell_start > _MAX_HEADER_CELL:
            continue
        rows_end = line_end
        while rows_end < len(text):  # the block goes on while its lines keep the delimiter
            next_end = text.find("\n", rows_end + 1)
            next_end = len(text) if next_end < 0 else next_end
            if text.find(delimiter, rows_end + 1, next_end) < 0:
                break
            rows_end = next_end
        return _Column(entity, delimiter, text.count(delimiter, line_start, start), (line_end, rows_end))
    return None


def _in_column(text: str, start: int, end: int, column: _Column) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    if text.count(column.delimiter, line_start, start) != column.index:
        return False
    cell_start = text.rfind(column.delimiter, line_start, start) + 1 or line_start
    line_end = text.find("\n", end)
    cell_end = text.find(column.delimiter, end, len(text) if line_end < 0 else line_end)
    cell_end = (len(text) if line_end < 0 else line_end) if cell_end < 0 else cell_end
    return not text[cell_start:start].strip(_CELL_PADDING) and not text[end:cell_end].strip(_CELL_PADDING)
