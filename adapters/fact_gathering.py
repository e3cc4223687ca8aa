"""Gathering what the routing layers decide from (``input.facts``), and letting the
sources keep what was decided. Sources are gathered side by side so their store reads
overlap, but one that reads another's fact (``FactSource.reads``: the intent classifier
reads the features and the session's pin) starts once that fact is in. The rounds are
computed once per tuple of sources: the executor's are fixed at start.
"""

from __future__ import annotations

import functools
import logging

from portcullis.adapters.pipeline import Exchange, FactSource
from portcullis.adapters.together import together

log = logging.getLogger("portcullis.gateway")


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


class FactGathering:
    def __init__(self, sources: tuple[FactSource, ...]) -> None:
        self.sources = sources
        # Fixed at start, so worked out once: the sources' order, and those that keep what was decided.
        self._order: dict[str, int] = {}
        for position, source in enumerate(sources):
            self._order.setdefault(source.name, position)
        self._keeping = tuple(source for source in sources if type(source).decided is not FactSource.decided)

    async def gather(self, exchange: Exchange) -> None:
        """Into ``exchange.facts``. A source that fails leaves its fact out (the policy
        decides what absence means); it never fails the request. The facts keep the
        sources' order whatever finished first."""
        for ready in fact_rounds(self.sources):
            facts = await together([self._gathered(exchange, source) for source in ready])
            for source, fact in zip(ready, facts, strict=True):
                if fact is not None:
                    exchange.facts[source.name] = fact
        if len(exchange.facts) > 1:  # the policy's input is the same document however the reads raced
            order = self._order
            for name in sorted(exchange.facts, key=lambda name: order.get(name, -1)):
                exchange.facts[name] = exchange.facts.pop(name)

    async def decided(self, exchange: Exchange) -> None:
        """Side by side too: each source keeps its own decision (a pinned tier). Most
        sources keep none (``decided`` not overridden) and are not called."""
        await together([self._decided(exchange, source) for source in self._keeping])

    @staticmethod
    async def _gathered(exchange: Exchange, source: FactSource) -> object:
        try:
            return await source.gather(exchange)
        except Exception as error:
            log.error("request %s: the %s fact could not be gathered: %s", exchange.request_id, source.name, type(error).__name__)
            return None

    @staticmethod
    async def _decided(exchange: Exchange, source: FactSource) -> None:
        try:
            await source.decided(exchange)
        except Exception as error:  # the request goes on; its next turn decides again
            log.error("request %s: what the plan decided for %s could not be kept: %s", exchange.request_id, source.name, type(error).__name__)
