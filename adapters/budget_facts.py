"""The ``budgets`` fact (L3 budget tiers): how far the team's tiered budget has got in
its current period, read from the ledger before the policy decides.

``input.facts.budgets = {"<rule name>": {"percent": <int>}}``, where the percent is the
counter instance's high-water mark over the rule's limit in the bundle serving the
request, so a tier reached within a period holds until the period ends, and a
revision that changes tiers or limits applies from the next request. Teams whose
bundle names no tiered budget cost nothing: no store call is made for them.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from portcullis.adapters.pipeline import Clock, Exchange, FactSource, utc_now
from portcullis.adapters.store.ledger import Ledger

log = logging.getLogger("portcullis.budget_tiers")


class BudgetFacts(FactSource):
    name: ClassVar[str] = "budgets"

    def __init__(self, ledger: Ledger, clock: Clock = utc_now) -> None:
        self._ledger = ledger
        self._clock = clock  # governance's: the period a reservation charges is the one read here

    async def gather(self, exchange: Exchange) -> Any:
        if exchange.bundle is None or exchange.principal is None:
            return None
        read = exchange.bundle.budget_reads.for_team(exchange.principal.team)
        if read is None:
            return None
        key = read.key(exchange.principal.as_input(), self._clock())
        try:
            peaks = await self._ledger.peaks([key])
        except Exception as error:  # StoreUnavailable, a driver's error: never the request's failure
            # Unknown utilisation means no tier: the budget's own limits still hold at reserve.
            log.warning("budget tiers: the utilisation of %s could not be read (%s)", read.budget, type(error).__name__)
            return None
        return {read.budget: {"percent": read.percent(peaks.get(key, 0))}}
