"""Provider keys as supply: each key's configured per-minute limits
(``portcullis.provider.key.limit``), whether it is cooling down after a 429
(``portcullis.provider.key.cooling_down``), and how many cool-downs this process started
(``portcullis.provider.key.cooldowns``). Providers and key names come from the
configuration only; no secret, env var name or client value is a label.

Where a cool-down lives decides how it is known here. A cool-down this process records
is heard at once (``KeyPool.on_cool_down``). Others are read from the store by
``refresh`` (``StoreGauges``' background task), one ``Capacity.cooling`` call for every
configured key: a PTTL pipeline in Redis, so a replica shows the keys another replica
cooled; the announcements heard from the host with ``workers: N`` on the embedded
store; this process's own table otherwise. Each is kept as the time it ends, so the
gauge drops to 0 when the cool-down does, between two refreshes or with the store
unreachable.

``cooling_down`` is 0 for every configured key that is not cooling, rather than absent:
the keys are a fixed set from the configuration, so the zeros cost nothing in
cardinality, tell "healthy" from "not reported", and let ``avg by (portcullis_provider)``
give the fraction of a provider's keys that are cooling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from portcullis.adapters.telemetry.registry import Labels, Registry

if TYPE_CHECKING:
    from portcullis.adapters.providers.keys import Capacity, KeyPool

log = logging.getLogger("portcullis.metrics")

PROVIDER, KEY = "portcullis.provider", "key"
Pair = tuple[str, str]  # (provider, key name), both from the configuration


class KeyGauges:
    def __init__(self, registry: Registry, pools: Mapping[str, KeyPool], capacity: Capacity, clock: Callable[[], float] = time.time) -> None:
        self._capacity = capacity
        self._clock = clock  # the capacities' own clock: epoch seconds
        self._pairs: tuple[Pair, ...] = tuple((pool.provider, allowance.name) for pool in pools.values() for allowance in pool.allowances)
        self._limits: list[tuple[Labels, float]] = []
        for pool in pools.values():
            for allowance in pool.allowances:
                for kind, limit in (("rpm", allowance.rpm), ("tpm", allowance.tpm)):
                    if limit is not None:  # a key without one has no limit to show
                        self._limits.append(((pool.provider, allowance.name, kind), float(limit)))
        self._until: dict[Pair, float] = {}  # when each known cool-down ends
        self._heard_at: dict[Pair, float] = {}  # when this process last recorded one
        self._failing = False
        self.cooldowns = registry.counter(
            "portcullis.provider.key.cooldowns", "{cooldown}", "Cool-downs this process started on provider keys after a 429", (PROVIDER, KEY)
        )
        registry.gauge(
            "portcullis.provider.key.limit",
            "/min",
            "Each provider key's configured capacity, per minute, by kind (rpm, tpm)",
            (PROVIDER, KEY, "kind"),
            self._limit,
        )
        registry.gauge(
            "portcullis.provider.key.cooling_down",
            "{key}",
            "1 while a provider key cools down after a 429 (on any replica sharing the store), else 0",
            (PROVIDER, KEY),
            self._cooling,
        )
        for pool in pools.values():
            pool.on_cool_down(self.cooled)

    def cooled(self, provider: str, key: str, seconds: float) -> None:
        """A cool-down this process recorded in the store."""
        now = self._clock()
        pair = (provider, key)
        self._until[pair] = max(self._until.get(pair, 0.0), now + seconds)
        self._heard_at[pair] = now
        self.cooldowns.add(pair)

    async def refresh(self) -> None:
        """The store's view of every configured key, in one call; never raises."""
        if not self._pairs:
            return
        started = self._clock()
        try:
            left = await self._capacity.cooling(self._pairs)
        except Exception as error:  # the known cool-downs still end on time
            if not self._failing:
                log.warning("provider key gauges: the cool-downs could not be read (%s)", type(error).__name__)
            self._failing = True
            return
        self._failing = False
        now = self._clock()
        until = {pair: now + seconds for pair, seconds in left.items()}
        for pair, heard in self._heard_at.items():  # recorded while the store was read: its answer may predate it
            if heard >= started:
                until[pair] = max(until.get(pair, 0.0), self._until.get(pair, 0.0))
        self._until = until  # the store is the authority: a cool-down it no longer has is over

    def _limit(self) -> Iterable[tuple[Labels, float]]:
        return self._limits

    def _cooling(self) -> Iterable[tuple[Labels, float]]:
        now = self._clock()
        return [(pair, 1.0 if self._until.get(pair, 0.0) > now else 0.0) for pair in self._pairs]
