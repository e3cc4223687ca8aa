"""Each pod's load, scraped in the background from its Prometheus endpoint
(``GET <endpoint>/metrics``) every few seconds, with aiohttp like every upstream call.

A scrape is bounded (a timeout, a body cap) and a pod whose scrape fails — refused,
slow, an error status, a body the parser will not read — has an unknown load, which
the picker treats as not overloaded: a metrics outage must not move conversations
off their pods. A pod's change between known and unknown is logged once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from portcullis.adapters.offload import off_loop
from portcullis.engine.pod_load import MAX_BYTES, MetricsError, PodLoad, parse_load

log = logging.getLogger("portcullis.endpoints")


class ScrapeFailed(Exception):
    """Why a scrape gave no load: a short reason, never the body."""


class LoadScraper:
    def __init__(self, provider: str, endpoints: Callable[[], frozenset[str]], path: str, timeout: float) -> None:
        self._provider = provider
        self._endpoints = endpoints
        self._path = path
        self._timeout = timeout
        self.loads: dict[str, PodLoad | None] = {}
        self._session: aiohttp.ClientSession | None = None

    async def scrape(self, endpoint: str) -> PodLoad:
        assert self._session is not None
        try:
            async with self._session.get(f"{endpoint}{self._path}", allow_redirects=False) as response:
                if response.status != 200:
                    raise ScrapeFailed(f"status {response.status}")
                body = bytearray()
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > MAX_BYTES:
                        raise ScrapeFailed(f"body over {MAX_BYTES} bytes")
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise ScrapeFailed(type(error).__name__) from None
        try:  # a large exposition (up to the 1 MiB cap: ~15 ms) is parsed off the event loop
            return await off_loop(len(body), parse_load, bytes(body))
        except MetricsError as error:
            raise ScrapeFailed(str(error)) from None

    async def scrape_all(self) -> None:
        """One round: every current pod at once; pods that left are forgotten."""
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self._timeout)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64), skip_auto_headers=("User-Agent",))
        endpoints = sorted(self._endpoints())
        results = await asyncio.gather(*(self.scrape(endpoint) for endpoint in endpoints), return_exceptions=True)
        loads: dict[str, PodLoad | None] = {}
        for endpoint, result in zip(endpoints, results, strict=True):
            if isinstance(result, PodLoad):
                loads[endpoint] = result
                if self.loads.get(endpoint, result) is None:
                    log.info("provider %s: endpoint %s reports its load again", self._provider, endpoint)
            elif isinstance(result, ScrapeFailed):
                loads[endpoint] = None
                if self.loads.get(endpoint) is not None or endpoint not in self.loads:
                    log.warning("provider %s: endpoint %s load unknown (metrics scrape: %s)", self._provider, endpoint, result)
            else:
                raise result
        self.loads = loads

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
