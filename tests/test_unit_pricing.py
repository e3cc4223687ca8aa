from __future__ import annotations

import datetime as dt

import pytest

from portcullis.engine.pricing import PriceTable, PricingError, Usage, micro_usd

TABLE = PriceTable(
    [
        {
            "provider": "p",
            "model": "m",
            "effective_from": "2025-01-01",
            "usd_per_mtok": {"input": "3", "output": "15", "cache_read": "0.30", "cache_write": "3.75"},
        },
        {"provider": "p", "model": "m", "effective_from": "2026-01-01", "usd_per_mtok": {"input": "2", "output": "10"}},
        {"provider": "p", "model": "m", "region": "eu", "effective_from": "2025-06-01", "usd_per_mtok": {"input": "4", "output": "20"}},
    ]
)


def test_decimal_strings_convert_exactly() -> None:
    assert micro_usd("0.075") == 75_000 and micro_usd("3.75") == 3_750_000 and micro_usd("0.000001") == 1
    for bad in ("0.0000001", "-1", "abc"):
        with pytest.raises(PricingError):
            micro_usd(bad)


def test_versions_and_regions() -> None:
    assert TABLE.price_for("p", "m", None, dt.date(2025, 12, 31)).micro_usd_per_mtok["input"] == 3_000_000
    assert TABLE.price_for("p", "m", None, dt.date(2026, 1, 1)).micro_usd_per_mtok["input"] == 2_000_000
    assert TABLE.price_for("p", "m", "eu", dt.date(2025, 7, 1)).micro_usd_per_mtok["input"] == 4_000_000
    assert TABLE.price_for("p", "m", "us", dt.date(2025, 7, 1)).micro_usd_per_mtok["input"] == 3_000_000  # falls back to global
    assert TABLE.price_for("p", "m", None, dt.date(2024, 1, 1)) is None
    assert TABLE.price_for("p", "other", None, dt.date(2025, 7, 1)) is None


def test_cost_sums_every_field_once_and_rounds_up_once() -> None:
    price = TABLE.price_for("p", "m", None, dt.date(2025, 7, 1))
    usage = Usage(input=100, output=20, cache_read=1000, cache_write=10)
    assert price.cost(usage) == 300 + 300 + 300 + 38  # 37.5 for cache writes, rounded up in the total
    assert price.cost(Usage(input=1)) == 3
    assert price.cost(Usage(cache_read=1)) == 1  # 0.3 micro-USD is still charged, never rounded to zero
    assert price.cost(Usage()) == 0


def test_an_omitted_cache_rate_charges_the_input_rate() -> None:
    price = TABLE.price_for("p", "m", None, dt.date(2026, 2, 1))  # this version names no cache rates
    assert price.cost(Usage(cache_read=1000, cache_write=1000)) == price.cost(Usage(input=2000)) == 4000
