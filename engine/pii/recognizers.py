"""Structured identifiers found by pattern and confirmed by checksum or format rules.

A pattern only proposes a candidate; a validator (``validators``) decides. Card
numbers must pass Luhn and start like a card, IBANs must have their country's length
and pass mod 97, Korean RRNs and Japanese My Numbers must carry a valid check digit
and (RRN) a real birth date, SSNs must follow the SSA's allocation rules, IP addresses
must parse. Each entity type is one compiled pattern; forms a number alone does not
carry (nine bare digits as an SSN) have a second one, reported only where a label
names them (``context``). Text is read folded (``engine.textfold``) and findings are
spans of the original. ``find`` runs them all and keeps, where findings overlap, the
one that ranks first in ``ENTITY_ORDER`` (then the longest).

What regex cannot see (names, places, organisations) is the NER detector's job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from portcullis.engine import textfold
from portcullis.engine.pii import context
from portcullis.engine.pii.validators import (
    card_valid,
    compact,
    credential_like,
    iban_valid,
    ipv4_valid,
    ipv6_valid,
    jp_my_number_valid,
    kr_rrn_labelled,
    kr_rrn_valid,
    phone_valid,
    secret_valid,
    ssn_valid,
)

# The entity types this module finds, most specific first: when two findings
# overlap, the earlier type wins (a key inside a PEM block is the block; a card
# number is not also a phone number).
ENTITY_ORDER = ("SECRET", "EMAIL", "IBAN", "CREDIT_CARD", "KR_RRN", "JP_MY_NUMBER", "US_SSN", "IP_ADDRESS", "PHONE")
# Types other detectors report; the policy may name these too.
NER_ENTITIES = ("PERSON", "LOCATION", "ORGANIZATION")
ALL_ENTITIES = ENTITY_ORDER + NER_ENTITIES


@dataclass(frozen=True)
class Finding:
    entity: str
    start: int
    end: int
    score: float = 1.0
    detector: str = "patterns"


# --- patterns --------------------------------------------------------------------------
#
# Scanning is two-step because Python's `re` costs 20–40 ns per character for a
# pattern that starts with a character class, and requests run to 100 KB. One RE2
# pass (linear time, ~3–8 ns per character) finds *triggers* — digit clusters, an
# "@", credential prefixes, IBAN heads, colon groups — and only the few windows around
# a trigger are matched precisely with `re` (lookarounds, back-references) and validated.

# Boundaries are ASCII: Korean and Japanese attach particles straight to a number
# ("5678입니다", "hanako@example.jp宛て"), and `\w` would count those as part of it.
_A = "A-Za-z0-9_"
# What a secret assigned to a name may be made of (printable ASCII but space, " ' ` , ;):
# the value ends at anything else, here and where the output guard holds a value.
SECRET_VALUE_CHARS = r"[!#-&(-+\--:<-\[\]-_a-~]"
_D = rf"(?<![{_A}.+-])"  # not glued to a word, a decimal or a sign
_E = rf"(?![{_A}-]|\.\d)"  # likewise at the end
_G = r"(?<!\d[ -])" + _D  # and not the tail of a longer grouped number

_PRECISE: dict[str, tuple[str, Callable[[str], bool] | None]] = {
    "SECRET": (
        "|".join(
            (
                r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]{16,8192}?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
                rf"(?<![{_A}])(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{{16}}(?![{_A}])",
                rf"(?<![{_A}])gh[pousr]_[A-Za-z0-9]{{36,255}}(?![{_A}])",
                rf"(?<![{_A}])github_pat_[A-Za-z0-9_]{{60,255}}",
                rf"(?<![{_A}])sk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_-]{{20,}}",
                rf"(?<![{_A}])xox[abposr]-[A-Za-z0-9-]{{10,}}",
                rf"(?<![{_A}])AIza[0-9A-Za-z_-]{{35}}(?![{_A}])",
                rf"(?<![{_A}])eyJ[A-Za-z0-9_-]{{8,}}\.eyJ[A-Za-z0-9_-]{{8,}}\.[A-Za-z0-9_-]{{8,}}",
                # a bearer credential, and a value assigned to a name that says it is secret:
                # the credential only, not the scheme or the name before it
                r"[Bb]earer (?P<token>[A-Za-z0-9._~+/-]{16,}=*)",
                r"(?i:secret|token|passw(?:or)?d|api[_-]?key|private[_-]?key)[A-Za-z0-9_]*[\"']?\s*[:=]\s*[\"']?(?!-----BEGIN)(?P<value>"
                + SECRET_VALUE_CHARS
                + "{8,})",
                # the password in a URL's credentials: scheme://user:password@host
                r"://[^/\s:@]{1,64}:(?P<secret>[^/\s@]{1,128})@",
            )
        ),
        secret_valid,
    ),
    # A local part may hold accented Latin letters (josé.pérez@), not the Hangul or kana a
    # sentence glues on before it.
    "EMAIL": (
        r"(?<![A-Za-z0-9\u00c0-\u024f._%+-])[A-Za-z0-9\u00c0-\u024f._%+-]{1,64}"
        r"@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+(?:[A-Za-z]{2,24}|xn--[a-z0-9-]{1,59})(?![A-Za-z0-9-])",
        None,
    ),
    # grouped by fours with one separator throughout, or not grouped
    "IBAN": (
        rf"(?<![{_A}])[A-Z]{{2}}\d{{2}}([ .-]?)[A-Z0-9]{{4}}(?:\1[A-Z0-9]{{4}}){{1,6}}(?:\1[A-Z0-9]{{1,3}})?(?![{_A}])",
        lambda t: iban_valid(compact(t)),
    ),
    "CREDIT_CARD": (_D + r"\d(?:[ .-]?\d){12,18}" + _E, card_valid),
    "KR_RRN": (_D + r"\d{2}[01]\d[0-3]\d-?[1-4]\d{6}" + _E, kr_rrn_valid),
    # not twelve digits out of a longer grouped number, at either end
    "JP_MY_NUMBER": (_G + r"\d{4}([ .-]?)\d{4}\1\d{4}(?!\1\d)" + _E, jp_my_number_valid),
    "US_SSN": (_D + r"\d{3}-\d{2}-\d{4}" + _E, ssn_valid),
    "IP_ADDRESS": (
        rf"(?<![{_A}.])(?:\d{{1,3}}\.){{3}}\d{{1,3}}(?![{_A}]|\.\d)"
        + rf"|(?<![{_A}:.])(?:[0-9A-Fa-f]{{0,4}}:){{2,7}}(?:[0-9A-Fa-f]{{1,4}}|(?:\d{{1,3}}\.){{3}}\d{{1,3}})?(?![{_A}:])",
        lambda t: ipv4_valid(t) if ":" not in t else ipv6_valid(t),
    ),
    "PHONE": (
        "|".join(
            (
                # international: +CC, an optional area code in brackets, then groups
                rf"(?<![{_A}+])\+\d{{1,3}}(?:[ .-]?\(\d{{1,4}}\))?(?:[ .-]?\d{{1,4}}){{2,5}}(?![{_A}-])",
                # national forms: (415) 555-0132, 415-555-0132, 010-1234-5678, 0504-1234-5678,
                # 06 12 34 56 78, 030 12345678, 612 34 56 78, 91 123 45 67; dots and dashes
                # group them too (010.1234.5678, 06.12.34.56.78, 030-12345678, 089/4567890)
                _D + r"\(\d{3}\) ?\d{3}-\d{4}" + _E,
                _D + r"\d{3}[-.]\d{3}[-.]\d{4}" + _E,
                _D + r"0\d{1,3}([.-])\d{3,4}\1\d{4}" + _E,
                _D + r"1-\d{3}-\d{3}-\d{4}" + _E,
                # space-grouped forms, unless they are the tail of a longer grouped number
                _G + r"0\d([ .-])\d{2}(?:\2\d{2}){3}" + _E,
                _G + r"\d{3} \d{3} \d{4}" + _E,
                _G + r"0\d{2,4} \d{3,4} \d{4}" + _E,
                _G + r"0\d{2,4}[ /-]\d{6,8}" + _E,
                _G + r"[6-9]\d{2}([ .])\d{2}(?:\3\d{2}){2}" + _E,
                _G + r"9\d \d{3}(?: \d{2}){2}" + _E,
            )
        ),
        phone_valid,
    ),
}
_SHRINKABLE = frozenset({"CREDIT_CARD", "IBAN"})
_GLUE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

# Forms found only where a label names them (``context``): nine bare or space-grouped
# digits called an SSN, an RRN without its check digit, an IBAN in lower case or
# grouped as a bank prints it ("DE89 37040044 0532013000").
_LABELLED: dict[str, tuple[str, Callable[[str], bool]]] = {
    "US_SSN": (_D + r"\d{3}([ .]?)\d{2}\1\d{4}" + _E, ssn_valid),
    "KR_RRN": (_D + r"\d{2}[01]\d[0-3]\d-?[1-8]\d{6}" + _E, kr_rrn_labelled),
    "IBAN": (rf"(?<![{_A}])(?i:[A-Z]{{2}}\d{{2}}(?: ?[A-Z0-9]){{11,30}})(?![{_A}])", lambda t: iban_valid(compact(t).upper())),
}


def _group_ends(value: str) -> list[int]:
    """Where a grouped number could end short of the whole match, longest first."""
    return [i for i in range(len(value) - 1, 0, -1) if value[i] in " .-"]


_VALUE_GROUPS = ("token", "value", "secret")  # where a match names the sensitive part, only that part counts
# Types with forms only a label finds: a value of theirs found once is looked for in the
# rest of the request (``find_repeated``).
LABELLED_ENTITIES = frozenset(_LABELLED)
_COMPILED = {entity: (re.compile(pattern), validate) for entity, (pattern, validate) in _PRECISE.items()}
_COMPILED_LABELLED = {entity: (re.compile(pattern), validate) for entity, (pattern, validate) in _LABELLED.items()}
_LABEL = "LABEL"  # a trigger that is a label: what follows it is read for the labelled forms

# Triggers, in RE2 syntax (no lookarounds): each group names the entity types whose
# precise patterns run in a window around it, and how far the window reaches.
_TRIGGERS: tuple[tuple[str, tuple[str, ...], int, int], ...] = (
    (r"[+(]?\d[\d ()./-]{5,}\d", ("CREDIT_CARD", "KR_RRN", "JP_MY_NUMBER", "US_SSN", "IP_ADDRESS", "PHONE"), 1, 1),
    (r"@", ("EMAIL",), 70, 270),
    (r"-----BEGIN", ("SECRET",), 0, 8300),
    (r"AKIA|ASIA|AGPA|AIDA|AROA|gh[pousr]_|github_pat_|sk-|xox[abposr]-|AIza|eyJ|[Bb]earer ", ("SECRET",), 8, 400),
    # the name and its separator only: the value may itself start another trigger (a PEM block)
    (r"(?i:secret|token|passw|api.?key|private.?key)[A-Za-z0-9_]*[\"']?\s*[:=]", ("SECRET",), 8, 140),
    (r"://[^/\s:@]{1,64}:[^/\s@]{1,128}@", ("SECRET",), 0, 0),
    (r"[A-Z]{2}\d{2}[ .-]?[A-Z0-9]{4}", ("IBAN",), 1, 45),
    (r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:", ("IP_ADDRESS",), 5, 45),
    (context.TRIGGER, (_LABEL,), 0, 80),
)
_NUMBER_TRIGGER = 0  # the digit clusters, where labelled numbers are looked for too
_TRIGGER = re2.compile("|".join(f"({pattern})" for pattern, *_ in _TRIGGERS))
# "version 1.2.3.4", '__version__ = "4.2.0.1"', "버전 2.7.0.3": a dotted quad the same line
# calls a version is not a host, nor dotted groups a phone.
_VERSION_BEFORE = re.compile(r"(?:\bv|\bver\.?) ?$|(?:version|versión|release|버전|バージョン)[^\n\d.]{0,16}$", re.IGNORECASE)


def find(text: str, entities: Iterable[str] | None = None, member: str | None = None) -> list[Finding]:
    """Every structured identifier in ``text`` (limited to ``entities`` when given),
    in order, without overlaps."""
    return resolve_overlaps(find_all(text, entities, member))


def find_all(text: str, entities: Iterable[str] | None = None, member: str | None = None) -> list[Finding]:
    """Every candidate that passed its validator, overlaps included: a caller that knows
    what each type costs (a policy) decides which of two overlapping ones wins.
    ``member`` is the name of the JSON member ``text`` is the value of, a label.

    The text is read folded (``engine.textfold``: Unicode spaces, dashes, full-width
    forms, e-mail percent-escapes); findings are spans of the original text."""
    if len(text) < 3 or text.isalpha():  # keys, roles, names: no digit, "@" or ":" to find
        return []
    folded = textfold.fold_mapped(text) if not text.isascii() or "%" in text else None
    read = folded.text if folded is not None else text
    wanted = set(ENTITY_ORDER if entities is None else entities)
    labelled = [entity for entity in _LABELLED if entity in wanted]
    named = context.member_entities(member) if member and labelled else frozenset()
    labels = context.Labels(read, named) if named else None  # made when the first label is met
    found: set[Finding] = set()
    for trigger in _TRIGGER.finditer(read):
        index = trigger.lastindex - 1
        _, kinds, before, after = _TRIGGERS[index]
        window = (max(0, trigger.start() - before), min(len(read), trigger.end() + after))
        if kinds == (_LABEL,):
            if labelled:
                labels = labels or context.Labels(read)
                entity = labels.add(*trigger.span())
                if entity in labelled:
                    found.update(_precise(entity, read, window, (trigger.end(), window[1]), labels))
            continue
        for entity in kinds:
            if entity in wanted:
                found.update(_precise(entity, read, window, trigger.span()))
        if index == _NUMBER_TRIGGER and labels is not None:
            for entity in labelled:
                if labels.any(entity):
                    found.update(_precise(entity, read, window, trigger.span(), labels))
    if member is not None and _VERSION_BEFORE.search(f"{member}: "):  # {"version": "4.1.2.7"}
        found = {f for f in found if f.entity != "IP_ADDRESS" or ":" in read[f.start : f.end]}
    if folded is not None and folded.decoded:
        found = {Finding(f.entity, *folded.span(f.start, f.end), f.score, f.detector) for f in found}
    return sorted(found, key=lambda f: (f.start, f.end, f.entity))


def _precise(entity: str, text: str, window: tuple[int, int], hit: tuple[int, int], labels: context.Labels | None = None) -> Iterator[Finding]:
    """Matches of ``entity``'s pattern around a trigger that pass its validator; with
    ``labels``, of its labelled form, where a label names them."""
    pattern, validate = _COMPILED[entity] if labels is None else _COMPILED_LABELLED[entity]
    # `pos` lets lookbehinds see before the window; one character past `endpos` lets
    # lookaheads see what follows it.
    for match in pattern.finditer(text, window[0], min(len(text), window[1] + 1)):
        if match.end() < hit[0] or match.start() > hit[1]:
            continue  # a neighbour of the trigger (touching counts: a bearer token follows its scheme)
        named = [name for name in _VALUE_GROUPS if match.groupdict().get(name) is not None]
        start, end = match.span(named[0]) if named else match.span()
        value = text[start:end]
        if validate is not None and not validate(value):
            if entity not in _SHRINKABLE:
                continue
            # "4111 1111 1111 1111 2024": the card is the valid prefix, not the greedy run
            end = next((start + cut for cut in _group_ends(value) if validate(value[:cut])), 0)
            if not end:
                continue
            value = text[start:end]
        if named == ["value"] and not credential_like(value):
            continue
        dotted = (entity == "IP_ADDRESS" and ":" not in value) or (entity == "PHONE" and "." in value)
        if dotted and _VERSION_BEFORE.search(text, max(0, start - 90), start):
            continue
        if labels is not None and not labels.names(entity, start, end):
            continue
        yield Finding(entity, start, end)


def find_repeated(text: str, known: Mapping[str, str]) -> list[Finding]:
    """Where ``text`` repeats a value found elsewhere in the same request (``known``:
    value -> entity type): nine digits a label called an SSN in a tool call are that SSN
    in the prose around it too, unlabelled there."""
    found = []
    for value, entity in known.items():
        at = text.find(value)
        while at >= 0:
            end = at + len(value)
            if not (at and text[at - 1] in _GLUE) and not (end < len(text) and text[end] in _GLUE):
                found.append(Finding(entity, at, end))
            at = text.find(value, end)
    return found


def with_repeats(texts: Sequence[str], results: list[list[Finding]]) -> list[list[Finding]]:
    """An identifier a label named anywhere in the request is the same identifier where
    another text repeats it unlabelled."""
    known = {text[f.start : f.end]: f.entity for text, found in zip(texts, results, strict=True) for f in found if f.entity in LABELLED_ENTITIES}
    if not known:
        return results
    return [sorted({*found, *find_repeated(text, known)}, key=lambda f: (f.start, f.end)) for text, found in zip(texts, results, strict=True)]


def resolve_overlaps(findings: Iterable[Finding], priority: Callable[[Finding], Any] | None = None) -> list[Finding]:
    """Findings sorted by position with overlaps removed: the one ``priority`` ranks
    first wins (by default the more specific entity type, then the longer span, then
    the higher score)."""
    rank = {entity: i for i, entity in enumerate(ALL_ENTITIES)}
    ordered = sorted(findings, key=priority or (lambda f: (rank.get(f.entity, len(rank)), -(f.end - f.start), -f.score)))
    kept: list[Finding] = []
    for finding in ordered:
        if all(finding.end <= k.start or finding.start >= k.end for k in kept):
            kept.append(finding)
    return sorted(kept, key=lambda f: f.start)
