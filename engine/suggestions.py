"""Closest names: what a refusal of an unknown model suggests instead. A typo or an
agent's newer default should lead the user to a name that works, in one step."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

SUGGESTIONS = 3
_CUTOFF = 0.5  # difflib ratio: below this a "suggestion" is noise
_LONGEST = 256  # twice the longest model name the bundle schema allows


def closest_names(requested: str, served: Iterable[str], limit: int = SUGGESTIONS) -> list[str]:
    """Up to ``limit`` of ``served`` most similar to ``requested``, best first,
    compared without case. Names that differ only by case count as the closest."""
    if len(requested) > _LONGEST:
        return []  # no served name is this long; and comparing costs time in proportion to the length
    by_folded: dict[str, str] = {}
    for name in served:
        by_folded.setdefault(name.casefold(), name)
    matches = difflib.get_close_matches(requested.casefold(), list(by_folded), n=limit, cutoff=_CUTOFF)
    return [by_folded[match] for match in matches]
