"""Endpoints from DNS: every A/AAAA record of a name (a Kubernetes headless Service
lists one per ready pod), resolved with the event loop's resolver and refreshed in
the background. A failed or empty lookup keeps the last good set: a resolver hiccup
must not empty the pool. A changed set is logged (addresses only; there is nothing
secret in them)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable

from portcullis.adapters.endpoint_config import DnsEndpoints

log = logging.getLogger("portcullis.endpoints")
LOOKUP_TIMEOUT_SECONDS = 5.0


def origin(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


class DnsEndpointSource:
    def __init__(self, provider: str, spec: DnsEndpoints, on_change: Callable[[frozenset[str]], None]) -> None:
        self._provider = provider
        self._spec = spec
        self._on_change = on_change
        self.current: frozenset[str] = frozenset()

    async def lookup(self) -> frozenset[str]:
        """The origins the name resolves to now (raises ``OSError`` or ``TimeoutError``)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(min(LOOKUP_TIMEOUT_SECONDS, self._spec.refresh_seconds * 2)):
            records = await loop.getaddrinfo(self._spec.host, self._spec.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        addresses = {str(sockaddr[0]) for family, *_, sockaddr in records if family in (socket.AF_INET, socket.AF_INET6)}
        # A link-local address needs its zone (fe80::1%eth0), which a URL cannot carry.
        return frozenset(origin(self._spec.scheme, address, self._spec.port) for address in addresses if "%" not in address)

    async def refresh(self) -> bool:
        """Look up once; the set changes only on a lookup that found something."""
        try:
            found = await self.lookup()
        except (OSError, TimeoutError) as error:
            name, kept = self._spec.host, len(self.current)
            log.warning("provider %s: DNS lookup of %s failed (%s); keeping %d endpoints", self._provider, name, type(error).__name__, kept)
            return False
        if not found:
            log.warning("provider %s: DNS name %s has no address; keeping %d endpoints", self._provider, self._spec.host, len(self.current))
            return False
        if found != self.current:
            added, removed = sorted(found - self.current), sorted(self.current - found)
            log.info("provider %s: endpoints from %s now %d (added %s, removed %s)", self._provider, self._spec.host, len(found), added, removed)
            self.current = found
            self._on_change(found)
        return True

    async def run(self) -> None:
        """Refresh every ``refresh_seconds`` until cancelled (the first lookup is the caller's)."""
        while True:
            await asyncio.sleep(self._spec.refresh_seconds)
            await self.refresh()
