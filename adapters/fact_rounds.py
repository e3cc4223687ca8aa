"""The rounds fact sources are gathered in. Sources are gathered side by side so their
store reads overlap, but one that reads another's fact (``FactSource.reads``: the
intent classifier reads the features and the session's pin) must start once that fact
is in. Computed once per tuple of sources: the executor's are fixed at start.
"""

from __future__ import annotations

import functools

from portcullis.adapters.pipeline import FactSource


@functools.cache
def fact_rounds(sources: tuple[FactSource, ...]) -> tuple[tuple[FactSource, ...], ...]:
    """The sources in rounds: each after the rounds holding the sources whose facts it
    reads, in the sources' order within a round (a cycle is broken in that order)."""
    rounds: list[tuple[FactSource, ...]] = []
    pending = sources
    while pending:
        waiting_for = {source.name for source in pending}
        ready = tuple(source for source in pending if waiting_for.isdisjoint(source.reads)) or pending[:1]
        rounds.append(ready)
        pending = tuple(source for source in pending if source not in ready)
    return tuple(rounds)
