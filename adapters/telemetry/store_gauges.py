"""Gauges of state the store holds — budget utilisation (``budget_gauge``) and provider
keys' cool-downs (``key_gauges``) — refreshed together by one background task: once at
start, so the first scrape has values, then every ``REFRESH_SECONDS``. Each refresh is
one batched ledger read and one cool-down read, whatever the traffic; requests never
wait on it, and a failed read leaves the task running (each gauge logs it once per
outage, naming the error's type only)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from portcullis.adapters.pipeline import Clock
from portcullis.adapters.telemetry.budget_gauge import BudgetGauge, CounterValues
from portcullis.adapters.telemetry.key_gauges import KeyGauges
from portcullis.adapters.telemetry.registry import Registry

if TYPE_CHECKING:
    from portcullis.adapters.providers.keys import Capacity, KeyPool

log = logging.getLogger("portcullis.metrics")

REFRESH_SECONDS = 15.0


class StoreGauges:
    def __init__(
        self,
        registry: Registry,
        ledger: CounterValues,
        capacity: Capacity,
        pools: Mapping[str, KeyPool],
        active_bundle: Callable[[], Any],
        clock: Clock,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self.budgets = BudgetGauge(registry, ledger, active_bundle, clock)
        self.keys = KeyGauges(registry, pools, capacity)
        self._seconds = refresh_seconds
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        await self.budgets.refresh()
        await self.keys.refresh()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as error:  # the gauges catch their stores' failures; this is a bug, and the task goes on
                log.error("store gauges: refresh failed (%s)", type(error).__name__)
            await asyncio.sleep(self._seconds)
