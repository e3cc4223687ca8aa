"""A provider's pods at run time: the current set (fixed, or from DNS), the ring built
over it (rebuilt only when the set or the policy's virtual-node count changes), each
pod's scraped load and the pods resting after a refused connection. ``order`` is the
order to try the pods in for one request; the choice itself is ``engine.endpoint_pick``.

Background work (DNS refresh, scraping) starts with the first request, inside the
event loop, and stops when the provider closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from portcullis.adapters.endpoint_config import EndpointPool
from portcullis.adapters.providers.endpoints.dns import DnsEndpointSource
from portcullis.adapters.providers.endpoints.scraper import LoadScraper
from portcullis.engine.endpoint_pick import pick_order
from portcullis.engine.endpoint_policy import EndpointPolicy
from portcullis.engine.hash_ring import POINTS, HashRing, point_of

log = logging.getLogger("portcullis.endpoints")
Clock = Callable[[], float]


class PodPool:
    def __init__(self, provider: str, config: EndpointPool, policy: Callable[[], EndpointPolicy], clock: Clock = time.monotonic) -> None:
        self.provider = provider
        self.config = config
        self._policy = policy
        self._clock = clock
        self._endpoints: frozenset[str] = frozenset(config.static)
        self._ring: HashRing | None = None
        self._resting: dict[str, float] = {}  # endpoint -> when it may come first again
        self._dns = DnsEndpointSource(provider, config.dns, self._use) if config.dns is not None else None
        self._scraper = LoadScraper(provider, lambda: self._endpoints, config.metrics_path, config.scrape_timeout_seconds)
        self._tasks: list[asyncio.Task[None]] = []
        self._started: asyncio.Future[None] | None = None

    @property
    def endpoints(self) -> frozenset[str]:
        return self._endpoints

    def _use(self, endpoints: frozenset[str]) -> None:
        self._endpoints = endpoints
        self._resting = {endpoint: until for endpoint, until in self._resting.items() if endpoint in endpoints}

    async def start(self) -> None:
        """Once: the first DNS lookup (awaited, so the first request has pods), then the
        background refresh and scrape."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        if self._dns is not None:
            await self._dns.refresh()
            self._tasks.append(asyncio.ensure_future(self._dns.run()))
        if self.config.scrapes:
            self._tasks.append(asyncio.ensure_future(self._scrape_forever()))

    async def _scrape_forever(self) -> None:
        while True:
            try:
                await self._scraper.scrape_all()
            except Exception:  # a bug here must not stop the scraping for good
                log.exception("provider %s: endpoint scrape failed", self.provider)
            await asyncio.sleep(self.config.scrape_seconds)

    def ring(self, policy: EndpointPolicy) -> HashRing:
        ring = self._ring
        if ring is None or ring.endpoints != self._endpoints or ring.virtual_nodes != policy.virtual_nodes:
            ring = self._ring = HashRing(self._endpoints, policy.virtual_nodes)
        return ring

    def order(self, affinity: str | None) -> list[str]:
        """Every pod, best first, for a request with this affinity key (None: any pod,
        chosen at random, so keyless requests spread)."""
        policy = self._policy()
        point = point_of(affinity) if affinity is not None else random.randrange(POINTS)
        now = self._clock()
        resting = {endpoint for endpoint, until in self._resting.items() if until > now}
        return pick_order(self.ring(policy), point, self._scraper.loads, resting, policy)

    def rest(self, endpoint: str) -> None:
        """``endpoint`` refused a connection: try it last for a while."""
        if self.config.cooldown_seconds > 0:
            if endpoint not in self._resting or self._resting[endpoint] <= self._clock():
                log.warning("provider %s: endpoint %s refused a connection; tried last for %.0f s", self.provider, endpoint, self.config.cooldown_seconds)
            self._resting[endpoint] = self._clock() + self.config.cooldown_seconds

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._started is not None and not self._started.done():
            self._started.cancel()
        await self._scraper.close()
