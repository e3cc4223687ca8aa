"""Redis's exception classes, imported the first time one is needed.

Every state object has an in-process and a Redis implementation side by side in one
module, and the Redis one catches Redis's errors. Importing ``redis`` for that costs
each gateway process ~7 MB resident (measured) that the embedded store never uses: the
classes resolve here on first access (an ``except`` names its class only when an
exception is raised), which only a shared store's objects ever make.
"""

from __future__ import annotations

from typing import Any

_NAMES = ("RedisError", "ResponseError")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(name)
    import redis.exceptions

    value = getattr(redis.exceptions, name)
    globals()[name] = value  # resolved once
    return value
