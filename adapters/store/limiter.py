"""Failed-authentication counters: fixed windows per client address, so guessing keys
from one address is throttled long before it could succeed."""

from __future__ import annotations

import hashlib
import time

import redis.asyncio as redis
from redis.exceptions import RedisError

from portcullis.adapters.store import StoreUnavailable


class MemoryFailureCounter:
    """In-process counters for the embedded mode (one gateway process)."""

    MAX_CLIENTS = 100_000  # bounded memory under a flood from many addresses

    def __init__(self, max_failures: int, window: int, clock=time.monotonic) -> None:
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
    """Counters shared by every replica; the key carries a hash, not the address itself."""

    def __init__(self, url: str, max_failures: int, window: int, prefix: str = "portcullis:") -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.redis = self._redis  # shared with the ledger
        self._max = max_failures
        self._window = window
        self._prefix = prefix

    def _key(self, client: str) -> str:
        return f"{self._prefix}authfail:{hashlib.sha256(client.encode()).hexdigest()[:32]}"

    async def retry_after(self, client: str) -> int | None:
        try:
            key = self._key(client)
            async with self._redis.pipeline(transaction=False) as pipe:
                count, ttl = await pipe.get(key).ttl(key).execute()
        except RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        if count is not None and int(count) >= self._max:
            return max(1, int(ttl)) if ttl and ttl > 0 else 1
        return None

    async def record_failure(self, client: str) -> None:
        try:
            key = self._key(client)
            async with self._redis.pipeline(transaction=True) as pipe:
                await pipe.incr(key).expire(key, self._window, nx=True).execute()
        except RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None

    async def close(self) -> None:
        await self._redis.aclose()
