"""Provider keys as supply (seed budget article): a provider may have several keys, each
with its own per-minute capacity. A request takes capacity on one key atomically; a key
the provider answered 429 on cools down, respecting retry-after, for every replica."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from portcullis.adapters.config import ProviderConfig
from portcullis.adapters.store.capacity import KeyAllowance, Taken

log = logging.getLogger("portcullis.providers")


@dataclass(frozen=True)
class ProviderKey:
    name: str
    secret: str | None


class Capacity(Protocol):
    async def take(self, provider: str, keys: list[KeyAllowance], tokens: int, start: int) -> Taken: ...
    async def cool_down(self, provider: str, key: str, seconds: float) -> None: ...
    async def cooling(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """Seconds each (provider, key) still cools down, as the store sees it, for those cooling."""
        ...


class KeyPool:
    def __init__(self, config: ProviderConfig, capacity: Capacity) -> None:
        self.provider = config.name
        self._keys = [ProviderKey(key.name, key.secret(config.name)) for key in config.keys]
        self._allowances = [KeyAllowance(key.name, key.rpm, key.tpm) for key in config.keys]
        self._capacity = capacity
        self._cooldown = config.cooldown_seconds
        self._turn = itertools.count()  # where the next search starts, so load spreads over keys
        self._listeners: list[Callable[[str, str, float], None]] = []

    @property
    def allowances(self) -> tuple[KeyAllowance, ...]:
        """Each key's name and configured rpm / tpm (no secret)."""
        return tuple(self._allowances)

    def on_cool_down(self, listener: Callable[[str, str, float], None]) -> None:
        """Call ``listener(provider, key name, seconds)`` after each cool-down the store recorded."""
        self._listeners.append(listener)

    @property
    def first(self) -> ProviderKey:
        return self._keys[0]

    async def take(self, tokens: int) -> tuple[ProviderKey | None, int]:
        """A key with room for ``tokens`` more this minute, or None and seconds to wait."""
        taken = await self._capacity.take(self.provider, self._allowances, tokens, next(self._turn) % len(self._keys))
        return (self._keys[taken.index] if taken.index is not None else None), taken.retry_after

    async def cool_down(self, key: ProviderKey, retry_after: int | None) -> None:
        seconds = retry_after if retry_after is not None else self._cooldown
        await self._capacity.cool_down(self.provider, key.name, seconds)
        for listener in self._listeners:  # only once recorded: a cool-down the store refused never started
            try:
                listener(self.provider, key.name, seconds)
            except Exception:  # a gauge's fault never reaches the request that met the 429
                log.exception("a cool-down listener failed for provider %s", self.provider)
