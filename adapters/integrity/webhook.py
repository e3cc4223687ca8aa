"""Tells an operator's endpoint that the gateway denied a tool call. Fire and forget:
the answer never waits for it, a failure is logged, and the body names the request,
principal, tool and rule, never arguments or text."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

log = logging.getLogger("portcullis.integrity")


class Webhook:
    def __init__(self, url: str, timeout: float) -> None:
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def notify(self, payload: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._post(payload))
        self._pending.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._pending.discard)

    async def _post(self, payload: dict[str, Any]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(self._url, json=payload) as response:
                if response.status >= 300:
                    log.warning("integrity webhook answered status %d", response.status)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("integrity webhook failed (%s)", type(error).__name__)

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=2)
        if self._session is not None:
            await self._session.close()
