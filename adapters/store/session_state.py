"""Small per-session values with a lifetime: the tier a conversation was pinned to, the
target that served it (its provider-side prompt cache). Losing one costs a cold cache
or a re-decided tier, never correctness, so the embedded store keeps them in process
(bounded: the oldest go first when full) and the shared one in Redis under the store's
key prefix, where every replica sees the same value.

``put_if_absent`` is how a first turn's decision is kept: concurrent first turns on two
replicas agree on one value (the first written), and every later turn reads it."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from portcullis.adapters.store import StoreUnavailable, redis_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis


class SessionState(Protocol):
    async def get(self, key: str) -> str | None: ...

    async def put_if_absent(self, key: str, value: str, ttl_ms: int) -> str:
        """Store ``value`` unless the key holds one; return the value the key now holds."""
        ...

    async def put(self, key: str, value: str, ttl_ms: int) -> None: ...


class MemorySessionState:
    MAX_ENTRIES = 100_000  # bounded memory: ~20 MB of keys and short values

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_ENTRIES) -> None:
        self._clock = clock
        self._max = max_entries
        self._values: OrderedDict[str, tuple[str, float]] = OrderedDict()

    async def get(self, key: str) -> str | None:
        found = self._values.get(key)
        if found is None:
            return None
        if found[1] <= self._clock():
            del self._values[key]
            return None
        return found[0]

    async def put_if_absent(self, key: str, value: str, ttl_ms: int) -> str:
        held = await self.get(key)
        if held is not None:
            return held
        await self.put(key, value, ttl_ms)
        return value

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        self._values.pop(key, None)
        self._values[key] = (value, self._clock() + ttl_ms / 1000)
        while len(self._values) > self._max:
            self._values.popitem(last=False)


class RedisSessionState:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = f"{prefix}session:"

    async def get(self, key: str) -> str | None:
        try:
            value = await self._redis.get(self._prefix + key)
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        return value.decode() if isinstance(value, bytes) else value

    async def put_if_absent(self, key: str, value: str, ttl_ms: int) -> str:
        try:
            # SET NX GET: written when absent, else the value already there, in one step
            held = await self._redis.set(self._prefix + key, value, nx=True, px=ttl_ms, get=True)
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        if held is None:
            return value
        return held.decode() if isinstance(held, bytes) else held

    async def put(self, key: str, value: str, ttl_ms: int) -> None:
        try:
            await self._redis.set(self._prefix + key, value, px=ttl_ms)
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
