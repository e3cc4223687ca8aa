"""A per-minute limit on token counts, per API key.

Counts are never billed (governance does not apply to them), so without a limit of
their own a key could make the gateway run its filters and call providers without end.
The windows are the auth-failure throttle's (``store.limiter``): fixed one-minute
windows per key, in Redis when the store is shared (every replica sees the same
count) and in this process when it is embedded. The limit is a defence, not a gate:
when Redis is away the windows are counted in this process until it is back.
"""

from __future__ import annotations

from portcullis.adapters.operations import Operation
from portcullis.adapters.pipeline import Admission, Exchange, Step
from portcullis.adapters.store import FailureCounter, Store
from portcullis.adapters.store.limiter import MemoryFailureCounter, RedisFailureCounter
from portcullis.engine.errors import ErrorKind, GatewayError

WINDOW_SECONDS = 60
RATE_LIMITED_CODE = "count_tokens_rate_limited"


class CountLimit(Step[None]):
    layer = "rate"

    operations = frozenset({Operation.COUNT_TOKENS})

    def __init__(self, windows: FailureCounter, per_minute: int) -> None:
        self._windows = windows
        self._per_minute = per_minute

    async def admit(self, exchange: Exchange) -> Admission[None] | None:
        assert exchange.principal is not None
        key = exchange.principal.key_id
        wait = await self._windows.retry_after(key)
        if wait is not None:
            raise GatewayError(
                ErrorKind.RATE_LIMITED,
                f"too many token counts: at most {self._per_minute} a minute per API key; try again later",
                code=RATE_LIMITED_CODE,
                retry_after=wait,
            )
        await self._windows.record_failure(key)  # one use of this minute's window
        return None


def count_limit(store: Store, redis_prefix: str, per_minute: int, windows: FailureCounter | None = None) -> CountLimit:
    """``windows``: given ones (a worker's proxy to the windows its supervisor hosts), else the store's kind decides."""
    if windows is not None:
        return CountLimit(windows, per_minute)
    if store.redis is not None:
        return CountLimit(RedisFailureCounter(store.redis, per_minute, WINDOW_SECONDS, redis_prefix, name="counts"), per_minute)
    return CountLimit(MemoryFailureCounter(per_minute, WINDOW_SECONDS), per_minute)
