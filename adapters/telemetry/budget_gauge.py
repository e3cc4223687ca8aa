"""``portcullis.budget.utilisation``: how much of each team-wide (and organisation-wide)
budget and token quota the current period has used, as a fraction of the limit's
ceiling, read from the ledger itself (embedded or shared).

A gauge is read synchronously at scrape time and the ledger is not, so ``refresh`` (run
by ``StoreGauges``' background task) reads every counter the active bundle defines in one
batched ``Ledger.values`` call and keeps the answer in a small table; ``observe`` serves
the table. What a refresh reads is bounded by the bundle: at most 3 counters per team
its rules cap, plus 3 for the organisation (``engine/team_counters.py``, which also says
why per-user, per-key and rate-window counters are left out). A failed read keeps the
last values, each for at most ``STALE_SECONDS`` after it was read: a store that stays
down then shows no utilisation rather than an old one.

Labels are the bundle's own names: the team (empty for the organisation's counters),
the scope kind (``team`` / ``org``), metric, period and the rules merged on the counter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from portcullis.adapters.pipeline import Clock
from portcullis.adapters.telemetry.labels import NONE
from portcullis.adapters.telemetry.registry import Labels, Registry
from portcullis.engine.team_counters import ORG, TeamCounter, team_counters

log = logging.getLogger("portcullis.metrics")

STALE_SECONDS = 300.0
LABELS = ("portcullis.team", "scope", "metric", "period", "rule")


class CounterValues(Protocol):
    async def values(self, keys: list[str]) -> dict[str, int]: ...


class BudgetGauge:
    def __init__(
        self,
        registry: Registry,
        ledger: CounterValues,
        active_bundle: Callable[[], Any],
        clock: Clock,
        stale_seconds: float = STALE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._active_bundle = active_bundle
        self._clock = clock  # governance's: the period instance read is the one requests charge
        self._stale = stale_seconds
        self._monotonic = monotonic
        self._digest: str | None = None
        self._counters: tuple[TeamCounter, ...] = ()
        self._table: dict[Labels, tuple[float, float]] = {}  # labels -> (utilisation, monotonic time read)
        self._failing = False
        registry.gauge(
            "portcullis.budget.utilisation",
            "1",
            "Team-wide and organisation-wide budgets and token quotas: the current period's counter over its limit (1 = the limit)",
            LABELS,
            self.observe,
        )

    def observe(self) -> Iterable[tuple[Labels, float]]:
        oldest = self._monotonic() - self._stale
        return [(labels, value) for labels, (value, read_at) in self._table.items() if read_at >= oldest]

    async def refresh(self) -> None:
        """One batched read of the active bundle's counters; never raises."""
        counters = self._bundle_counters()
        now = self._clock()
        keyed = {counter.key(now): counter for counter in counters}
        try:
            values = await self._ledger.values(list(keyed)) if keyed else {}
        except Exception as error:  # StoreUnavailable, a driver's error: the last values stand until they are stale
            if not self._failing:
                log.warning("budget utilisation: the ledger could not be read (%s); the last values are kept for %.0f s", type(error).__name__, self._stale)
            self._failing = True
            return
        if self._failing:
            log.info("budget utilisation: the ledger is readable again")
            self._failing = False
        read_at = self._monotonic()
        # A counter the store does not have yet was never charged this period: 0, not unknown.
        self._table = {_labels(counter): (values.get(key, 0) / counter.ceiling, read_at) for key, counter in keyed.items()}

    def _bundle_counters(self) -> tuple[TeamCounter, ...]:
        bundle = self._active_bundle()
        if bundle is None:
            return ()
        if bundle.digest != self._digest:  # worked out once per bundle
            self._counters = team_counters(bundle.bundle.data.get("portcullis"))
            self._digest = bundle.digest
        return self._counters


def _labels(counter: TeamCounter) -> Labels:
    scope = ORG if counter.team is None else "team"
    return (counter.team or NONE, scope, counter.metric, counter.period, ",".join(counter.rules))
