"""What each policy action puts in place of a finding.

- ``mask``: letters and digits become ``*``, separators stay, and a few characters
  that identify nothing on their own stay visible (a card's first and last four).
- ``redact``: ``[REDACTED]``.
- ``pseudonymize``: ``<EMAIL_1>`` — numbered per session in order of first sight, so
  the same value is the same placeholder in every turn and the prompt prefix stays
  byte-stable; restored in the answer for the same principal and session.
- ``tokenize``: ``<EMAIL_TKN_3f9a1c2be7>`` — one per value for the whole team, kept
  longer, restored only for principals the policy authorises.
- ``block``: nothing is sent; the request is refused naming the entity type.

Placeholders use only ``<``, ``>``, capitals, digits, ``_`` and hex, so they pass
through JSON strings unescaped and tokenizers keep them intact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from portcullis.engine.pii.recognizers import Finding

ACTIONS = ("block", "redact", "tokenize", "pseudonymize", "mask")
# Most restrictive first: where two policies name the same entity, the earlier wins.
STRICTNESS = {action: rank for rank, action in enumerate(ACTIONS)}
REVERSIBLE = ("pseudonymize", "tokenize")
REDACTED = "[REDACTED]"

PLACEHOLDER = re.compile(r"<([A-Z][A-Z_]{1,30}?)_(?:(\d{1,6})|TKN_([0-9a-f]{10}))>")
PLACEHOLDER_MAX = 48  # longest text PLACEHOLDER can match


def pseudonym(entity: str, number: int) -> str:
    return f"<{entity}_{number}>"


def token(entity: str, token_id: str) -> str:
    return f"<{entity}_TKN_{token_id}>"


def is_token(placeholder: str) -> bool:
    return "_TKN_" in placeholder


# How much of each type stays visible when masked: (leading, trailing) letters/digits.
_KEEP = {
    "CREDIT_CARD": (4, 4),
    "IBAN": (4, 4),
    "PHONE": (0, 4),
    "US_SSN": (0, 4),
    "KR_RRN": (7, 0),  # birth date and the sex/century digit, as Korean forms print it
}


# How an e-mail's "@" may be written where the folded text found it.
_AT_SIGNS = ("@", "\uff20", "%40")


def mask(entity: str, value: str) -> str:
    at = next((sign for sign in _AT_SIGNS if sign in value), None) if entity == "EMAIL" else None
    if at is not None:
        local, domain = value.rsplit(at, 1)
        return local[:1] + "*" * (len(local) - 1) + at + domain
    lead, trail = _KEEP.get(entity, (0, 0))
    positions = [i for i, c in enumerate(value) if c.isalnum()]
    hidden = set(positions[lead : len(positions) - trail])
    return "".join("*" if i in hidden else c for i, c in enumerate(value))


def replacement(action: str, entity: str, value: str, placeholders: Mapping[tuple[str, str], str]) -> str:
    if action == "mask":
        return mask(entity, value)
    if action == "redact":
        return REDACTED
    return placeholders[(entity, value)]


def rewrite(text: str, findings: Sequence[Finding], actions: Mapping[str, str], placeholders: Mapping[tuple[str, str], str]) -> str:
    """``text`` with every finding whose entity has a transforming action replaced."""
    pieces: list[str] = []
    at = 0
    for finding in findings:
        action = actions.get(finding.entity)
        if action is None or action == "block":
            continue
        pieces.append(text[at : finding.start])
        pieces.append(replacement(action, finding.entity, text[finding.start : finding.end], placeholders))
        at = finding.end
    if not pieces:
        return text
    pieces.append(text[at:])
    return "".join(pieces)
