"""Signatures already seen: a SigV4 signature is valid for the whole clock-skew window,
so a captured request could be sent again until its date goes stale. Each verified
signature is remembered that long and a second sighting is refused. In process for the
embedded store; in Redis (``SET NX PX``, under the store's key prefix) for the shared
one, so a replay to another replica is caught too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from portcullis.adapters.store import StoreUnavailable, redis_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis


class ReplayGuard(Protocol):
    async def first_sighting(self, signature: str, remember_ms: int) -> bool:
        """Whether ``signature`` is new; it is then remembered for ``remember_ms``."""
        ...

    async def forget(self, signature: str) -> None:
        """Let ``signature`` be seen once more (its request was refused before it did anything)."""
        ...


class MemoryReplayGuard:
    # Bounded memory (~40 MB): expired entries are swept when it fills; when every entry
    # is still live (over ~200 signed requests a second for 15 minutes) new signatures are
    # refused rather than old ones forgotten, which would let those be replayed.
    MAX_ENTRIES = 200_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, float] = {}

    async def first_sighting(self, signature: str, remember_ms: int) -> bool:
        now = self._clock()
        expires = self._seen.get(signature)
        if expires is not None and expires > now:
            return False
        if len(self._seen) >= self.MAX_ENTRIES:
            self._seen = {seen: until for seen, until in self._seen.items() if until > now}
            if len(self._seen) >= self.MAX_ENTRIES:
                raise StoreUnavailable("too many signed requests in the replay window for the embedded store")
        self._seen[signature] = now + remember_ms / 1000
        return True

    async def forget(self, signature: str) -> None:
        self._seen.pop(signature, None)


class RedisReplayGuard:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = f"{prefix}sigv4-seen:"

    async def first_sighting(self, signature: str, remember_ms: int) -> bool:
        try:  # fails closed: a replay cannot be ruled out without Redis
            return bool(await self._redis.set(self._prefix + signature, b"1", nx=True, px=remember_ms))
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None

    async def forget(self, signature: str) -> None:
        try:
            await self._redis.delete(self._prefix + signature)
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
