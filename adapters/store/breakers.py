"""The breaker board: every target's circuit breaker, shared by the replicas.

A breaker is closed (failures are counted; a success resets the count), open (until a
moment: the target is skipped) or half-open (that moment has passed: one probe request
may go; its success closes the breaker, its failure opens it for another cool-off).
The board keeps only the breakers that are not plainly healthy, so reading it whole
is one small round trip: the open ones with the moment each half-opens, and the
closed ones with failures counted.

The embedded store keeps it in process; the shared one in Redis under the store's key
prefix (one sorted set of open breakers, one hash of failure counts, one probe lease
per half-open target, ``SET NX PX``), each change one Lua script so replicas racing on
the same breaker agree. The caller passes the time (epoch milliseconds): replicas'
clocks are assumed close, and tests inject one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from portcullis.adapters.store import StoreUnavailable, redis_errors
from portcullis.engine.breakers import BreakerRule

if TYPE_CHECKING:
    from redis.asyncio import Redis

Transition = Literal["opened", "reopened"] | None
Claim = Literal["probe", "closed", "open", "busy"]  # the probe is this request's; no breaker; still open; another's probe


@dataclass(frozen=True)
class BoardView:
    open_until: dict[str, int]  # target -> when it half-opens (epoch ms; in the past: half-open now)
    failing: frozenset[str] = frozenset()  # closed targets with failures counted

    def state(self, target: str, now_ms: int) -> Literal["closed", "open", "half_open"]:
        until = self.open_until.get(target)
        if until is None:
            return "closed"
        return "open" if until > now_ms else "half_open"

    def watched(self, target: str) -> bool:
        """Whether a success on ``target`` has anything to reset."""
        return target in self.open_until or target in self.failing


EMPTY_VIEW = BoardView({})


class BreakerBoard(Protocol):
    async def view(self) -> BoardView: ...

    async def failed(self, target: str, rule: BreakerRule, now_ms: int) -> tuple[Transition, int]:
        """Count a failure; (what it changed, when the breaker half-opens, 0 if closed)."""
        ...

    async def succeeded(self, target: str, probe: bool) -> bool:
        """Reset ``target``'s count of consecutive failures; the probe's success also closes
        its breaker (whether it was open or half-open is returned). Any other success —
        a request sent before the breaker opened, or by a replica that had not seen it open
        yet — says nothing of the target now, and leaves an open breaker open."""
        ...

    async def claim_probe(self, target: str, lease_ms: int, now_ms: int) -> Claim:
        """For a half-open breaker, the one probe (held ``lease_ms``, or until its outcome)."""
        ...

    async def release_probe(self, target: str) -> None:
        """Let another request probe: this one's outcome said nothing of the target's health."""
        ...


class MemoryBreakerBoard:
    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._probes: dict[str, int] = {}  # target -> lease expiry (epoch ms)

    async def view(self) -> BoardView:
        return BoardView(dict(self._open), frozenset(self._failures))

    async def failed(self, target: str, rule: BreakerRule, now_ms: int) -> tuple[Transition, int]:
        until = self._open.get(target)
        if until is not None:
            if until > now_ms:  # a request sent before it opened: already counted enough
                return None, until
            self._open[target] = now_ms + rule.open_ms  # half-open, and the probe failed
            self._probes.pop(target, None)
            return "reopened", self._open[target]
        count = self._failures.get(target, 0) + 1
        if count < rule.consecutive_failures:
            self._failures[target] = count
            return None, 0
        self._failures.pop(target, None)
        self._open[target] = now_ms + rule.open_ms
        return "opened", self._open[target]

    async def succeeded(self, target: str, probe: bool) -> bool:
        self._failures.pop(target, None)
        if not probe:
            return False
        self._probes.pop(target, None)
        return self._open.pop(target, None) is not None

    async def claim_probe(self, target: str, lease_ms: int, now_ms: int) -> Claim:
        until = self._open.get(target)
        if until is None:
            return "closed"
        if until > now_ms:
            return "open"
        if self._probes.get(target, 0) > now_ms:
            return "busy"
        self._probes[target] = now_ms + lease_ms
        return "probe"

    async def release_probe(self, target: str) -> None:
        self._probes.pop(target, None)


# KEYS: open zset, failures hash, probe lease. ARGV: target, threshold, open_ms, now_ms.
_FAILED = """
local open_until = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = tonumber(ARGV[4])
if open_until then
  open_until = tonumber(open_until)
  if open_until > now then return {0, open_until} end
  open_until = now + tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], open_until, ARGV[1])
  redis.call('DEL', KEYS[3])
  return {2, open_until}
end
local count = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if count < tonumber(ARGV[2]) then return {0, 0} end
redis.call('HDEL', KEYS[2], ARGV[1])
open_until = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], open_until, ARGV[1])
return {1, open_until}
"""

# KEYS: open zset, failures hash, probe lease. ARGV: target.
_SUCCEEDED = """
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] ~= '1' then return 0 end
redis.call('DEL', KEYS[3])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# KEYS: open zset, probe lease. ARGV: target, lease_ms, now_ms.
_CLAIM = """
local open_until = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not open_until then return 'closed' end
if tonumber(open_until) > tonumber(ARGV[3]) then return 'open' end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return 'probe' end
return 'busy'
"""

# KEYS: open zset, failures hash.
_VIEW = """
return {redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('HKEYS', KEYS[2])}
"""

_TRANSITIONS: dict[int, Transition] = {0: None, 1: "opened", 2: "reopened"}


class RedisBreakerBoard:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._open = f"{prefix}breaker:open"
        self._failures = f"{prefix}breaker:failures"
        self._probe = f"{prefix}breaker:probe:"
        self._view = redis.register_script(_VIEW)
        self._failed = redis.register_script(_FAILED)
        self._succeeded = redis.register_script(_SUCCEEDED)
        self._claim = redis.register_script(_CLAIM)

    async def view(self) -> BoardView:
        try:
            scored, failing = await self._view(keys=[self._open, self._failures])
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        pairs = iter(scored)
        open_until = {_text(target): int(float(score)) for target, score in zip(pairs, pairs, strict=True)}
        return BoardView(open_until, frozenset(_text(target) for target in failing))

    async def failed(self, target: str, rule: BreakerRule, now_ms: int) -> tuple[Transition, int]:
        try:
            code, until = await self._failed(
                keys=[self._open, self._failures, self._probe + target], args=[target, rule.consecutive_failures, rule.open_ms, now_ms]
            )
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        return _TRANSITIONS[int(code)], int(until)

    async def succeeded(self, target: str, probe: bool) -> bool:
        try:
            return bool(await self._succeeded(keys=[self._open, self._failures, self._probe + target], args=[target, "1" if probe else "0"]))
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None

    async def claim_probe(self, target: str, lease_ms: int, now_ms: int) -> Claim:
        try:
            claim = await self._claim(keys=[self._open, self._probe + target], args=[target, lease_ms, now_ms])
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        return _text(claim)  # type: ignore[return-value]

    async def release_probe(self, target: str) -> None:
        try:
            await self._redis.delete(self._probe + target)
        except redis_errors.RedisError as error:
            raise StoreUnavailable(f"Redis is unavailable: {type(error).__name__}") from None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
