"""Failed-authentication counters: fixed windows per client address, so guessing keys
from one address is throttled long before it could succeed."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from portcullis.adapters.store import redis_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis


log = logging.getLogger("portcullis.auth")


class MemoryFailureCounter:
    """In-process counters for the embedded mode (one gateway process)."""

    MAX_CLIENTS = 100_000  # bounded memory under a flood from many addresses

    def __init__(self, max_failures: int, window: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_failures
        self._window = window
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}

    async def retry_after(self, client: str) -> int | None:
        started, count = self._windows.get(client, (0.0, 0))
        remaining = started + self._window - self._clock()
        if count >= self._max and remaining > 0:
            return max(1, int(remaining + 0.999))
        return None

    async def record_failure(self, client: str) -> None:
        now = self._clock()
        started, count = self._windows.get(client, (now, 0))
        if now - started >= self._window:
            started, count = now, 0
        if len(self._windows) >= self.MAX_CLIENTS and client not in self._windows:
            self._windows = {c: w for c, w in self._windows.items() if now - w[0] < self._window}
        self._windows[client] = (started, count + 1)

    async def close(self) -> None:
        return None


class RedisFailureCounter:
    """Counters shared by every replica; the key carries a hash, not the address itself.

    The throttle is a defence, not a gate: when Redis cannot be reached, failures are
    counted in this process instead, so keys still authenticate (from PostgreSQL) and
    guessing from one address is still slowed, per replica, until Redis is back."""

    def __init__(
        self,
        client: Redis,
        max_failures: int,
        window: int,
        prefix: str = "portcullis:",
        clock: Callable[[], float] = time.monotonic,
        name: str = "authfail",  # what is counted: another use of the same windows keeps its own keys
    ) -> None:
        self._redis = client
        self._max = max_failures
        self._window = window
        self._prefix = f"{prefix}{name}:"
        self._local = MemoryFailureCounter(max_failures, window, clock)
        self._clock = clock
        self._warned_at: float | None = None

    def _key(self, client: str) -> str:
        return f"{self._prefix}{hashlib.sha256(client.encode()).hexdigest()[:32]}"

    async def retry_after(self, client: str) -> int | None:
        try:
            key = self._key(client)
            async with self._redis.pipeline(transaction=False) as pipe:
                count, ttl = await pipe.get(key).ttl(key).execute()
        except redis_errors.RedisError as error:
            self._falling_back(error)
            return await self._local.retry_after(client)
        if count is not None and int(count) >= self._max:
            return max(1, int(ttl)) if ttl and ttl > 0 else 1
        return await self._local.retry_after(client)  # failures counted here while Redis was away still count

    async def record_failure(self, client: str) -> None:
        try:
            key = self._key(client)
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.incr(key).expire(key, self._window, nx=True).execute()
        except redis_errors.RedisError as error:
            self._falling_back(error)
            await self._local.record_failure(client)

    def _falling_back(self, error: Exception) -> None:
        now = self._clock()
        if self._warned_at is None or now - self._warned_at > 60:  # once a minute, not once a request
            self._warned_at = now
            log.warning("%s counters: Redis is unavailable (%s); counting in this process", self._prefix, type(error).__name__)

    async def close(self) -> None:
        return None  # the client belongs to the store
