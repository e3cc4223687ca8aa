"""Supply-side capacity: how much of each provider key's per-minute allowance is used,
and which keys are cooling down after a 429. In-process for the embedded mode, in
Redis for the shared one, where every replica sees the same minute and cooldowns."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from portcullis.adapters.store import StoreUnavailable, redis_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis


@dataclass(frozen=True)
class KeyAllowance:
    name: str
    rpm: int | None
    tpm: int | None


@dataclass(frozen=True)
class Taken:
    """The index of the key that took the request, or None and the seconds until one may."""

    index: int | None
    retry_after: int


class MemoryCapacity:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._used: dict[tuple[str, str, int], tuple[int, int]] = {}
        self._cool_until: dict[tuple[str, str], float] = {}

    async def take(self, provider: str, keys: Sequence[KeyAllowance], tokens: int, start: int) -> Taken:
        now = self._clock()
        minute = int(now // 60)
        wait = None
        for step in range(len(keys)):
            key = keys[(start + step) % len(keys)]
            cooling = self._cool_until.get((provider, key.name), 0) - now
            if cooling > 0:
                wait = cooling if wait is None else min(wait, cooling)
                continue
            requests, used = self._used.get((provider, key.name, minute), (0, 0))
            if (key.rpm is None or requests + 1 <= key.rpm) and (key.tpm is None or used + tokens <= key.tpm):
                self._used = {k: v for k, v in self._used.items() if k[2] >= minute - 1} if len(self._used) > 10_000 else self._used
                self._used[(provider, key.name, minute)] = (requests + 1, used + tokens)
                return Taken((start + step) % len(keys), 0)
            next_minute = (minute + 1) * 60 - now
            wait = next_minute if wait is None else min(wait, next_minute)
        return Taken(None, max(1, int((wait or 1) + 0.999)))

    async def cool_down(self, provider: str, key: str, seconds: float) -> None:
        self.cool_until(provider, key, self._clock() + seconds)

    def cool_until(self, provider: str, key: str, until: float) -> None:
        """Cool a key until ``until`` (this clock's seconds): a cool-down decided elsewhere."""
        self._cool_until[(provider, key)] = until

    async def cooling(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """Seconds each (provider, key) still cools down, for those cooling."""
        now = self._clock()
        left = {pair: self._cool_until.get(pair, 0) - now for pair in keys}
        return {pair: seconds for pair, seconds in left.items() if seconds > 0}


# KEYS: per key (3 each): cooldown, requests this minute, tokens this minute.
# ARGV: tokens, start, ms into the minute, then per key: rpm (-1: none), tpm (-1: none).
_TAKE = """
local n = #KEYS / 3
local tokens, start, into = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local wait = -1
for step = 0, n - 1 do
  local i = ((start + step) % n) + 1
  local cooling = redis.call('PTTL', KEYS[3 * i - 2])
  if cooling > 0 then
    if wait < 0 or cooling < wait then wait = cooling end
  else
    local rpm, tpm = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
    local requests = tonumber(redis.call('GET', KEYS[3 * i - 1]) or '0')
    local used = tonumber(redis.call('GET', KEYS[3 * i]) or '0')
    if (rpm < 0 or requests + 1 <= rpm) and (tpm < 0 or used + tokens <= tpm) then
      redis.call('INCR', KEYS[3 * i - 1])
      redis.call('EXPIRE', KEYS[3 * i - 1], 120)
      redis.call('INCRBY', KEYS[3 * i], tokens)
      redis.call('EXPIRE', KEYS[3 * i], 120)
      return {i - 1, 0}
    end
    local left = 60000 - into
    if wait < 0 or left < wait then wait = left end
  end
end
return {-1, wait}
"""


class RedisCapacity:
    def __init__(self, redis: Redis, prefix: str, clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._prefix = prefix
        self._clock = clock
        self._take = redis.register_script(_TAKE)

    async def take(self, provider: str, keys: Sequence[KeyAllowance], tokens: int, start: int) -> Taken:
        now = self._clock()
        minute = int(now // 60)
        names: list[str] = []
        limits: list[int] = []
        for key in keys:
            base = f"{self._prefix}supply:{provider}:{key.name}"
            names += [f"{base}:cooldown", f"{base}:requests:{minute}", f"{base}:tokens:{minute}"]
            limits += [-1 if key.rpm is None else key.rpm, -1 if key.tpm is None else key.tpm]
        try:
            index, wait = await self._take(keys=names, args=[tokens, start, int(now * 1000) % 60000, *limits])
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        if index < 0:
            return Taken(None, max(1, int(wait / 1000 + 0.999)))
        return Taken(int(index), 0)

    async def cool_down(self, provider: str, key: str, seconds: float) -> None:
        try:
            await self._redis.set(f"{self._prefix}supply:{provider}:{key}:cooldown", "1", px=max(1, int(seconds * 1000)))
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None

    async def cooling(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """Seconds each (provider, key) still cools down, whichever replica cooled it: one
        pipelined round trip of PTTLs."""
        if not keys:
            return {}
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for provider, key in keys:
                    pipe.pttl(f"{self._prefix}supply:{provider}:{key}:cooldown")
                left = await pipe.execute()
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        return {pair: ms / 1000 for pair, ms in zip(keys, left, strict=True) if ms > 0}  # -2: none, -1: no expiry (never written so)
