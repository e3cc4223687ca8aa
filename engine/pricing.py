"""Usage and cost in integer micro-USD.

Prices are authored as decimal strings in USD per million tokens and converted
exactly (no float ever touches money) to micro-USD per million tokens. A cost is
the sum over non-overlapping usage fields, rounded *up* once to a whole micro-USD,
so the gateway never under-charges by rounding.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

MICRO = 1_000_000
TOKENS_PER_PRICE_UNIT = 1_000_000
USAGE_FIELDS = ("input", "output", "cache_read", "cache_write")


class PricingError(Exception):
    """A price is malformed, or a route has no price in effect."""


@dataclass(frozen=True)
class Usage:
    """Token counts that never overlap: ``input`` excludes cached input."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def input_total(self) -> int:
        """All the input the model read: uncached, read from its cache, written to it."""
        return self.input + self.cache_read + self.cache_write

    @property
    def total(self) -> int:
        return self.input_total + self.output

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in USAGE_FIELDS}


@dataclass(frozen=True)
class Price:
    provider: str
    model: str
    region: str | None
    effective_from: dt.date
    micro_usd_per_mtok: Mapping[str, int]  # usage field -> micro-USD per million tokens

    def cost(self, usage: Usage) -> int:
        # A price that omits a cache rate charges cached tokens as plain input: never free.
        input_rate = self.micro_usd_per_mtok["input"]
        numerator = sum(getattr(usage, name) * self.micro_usd_per_mtok.get(name, input_rate) for name in USAGE_FIELDS)
        return -(-numerator // TOKENS_PER_PRICE_UNIT)  # ceiling division: explicit round-up


def micro_usd(amount: str) -> int:
    """Exact conversion of a decimal USD string to integer micro-USD."""
    try:
        value = Decimal(amount) * MICRO
    except (InvalidOperation, TypeError):
        raise PricingError(f"price {amount!r} is not a decimal number") from None
    if value != value.to_integral_value() or value < 0:
        raise PricingError(f"price {amount!r} is negative or finer than one micro-USD")
    return int(value)


class PriceTable:
    """Versioned prices by (provider, upstream model, region)."""

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        self._versions: dict[tuple[str, str, str | None], list[Price]] = {}
        for entry in entries:
            price = Price(
                provider=entry["provider"],
                model=entry["model"],
                region=entry.get("region"),
                effective_from=dt.date.fromisoformat(entry["effective_from"]),
                micro_usd_per_mtok={name: micro_usd(value) for name, value in entry["usd_per_mtok"].items()},
            )
            key = (price.provider, price.model, price.region)
            self._versions.setdefault(key, []).append(price)
        for versions in self._versions.values():
            versions.sort(key=lambda price: price.effective_from)

    def price_for(self, provider: str, model: str, region: str | None, on: dt.date) -> Price | None:
        """The version in effect on ``on``; a region-specific price beats a global one."""
        for key in ((provider, model, region), (provider, model, None)):
            current = None
            for price in self._versions.get(key, ()):
                if price.effective_from <= on:
                    current = price
            if current is not None:
                return current
        return None
