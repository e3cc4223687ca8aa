"""The pure parts of governance: periods, bounds, the admission verdict, thresholds,
and sizing a request's input."""

from __future__ import annotations

import datetime as dt

import pytest

from portcullis.engine.governance import (
    Bound,
    Charge,
    CounterLimit,
    Limits,
    bound_for,
    charges,
    judge,
    period_end,
    period_key,
    period_range,
    reached_thresholds,
    refusal,
    window_wait_ms,
)
from portcullis.engine.pricing import PriceTable
from portcullis.engine.tokens import IMAGE_TOKENS, TIKTOKEN, UPPER_BOUND, count_input_tokens

NOW = dt.datetime(2026, 11, 30, 23, 59, 30, tzinfo=dt.UTC)


def limit(metric: str = "cost", period: str = "month", block: int | None = 100, warn: int | None = None, hard: bool = True) -> CounterLimit:
    return CounterLimit("team:t", metric, period, block, warn, hard, ("r",), (80, 95))


def charge(amount: int, **kwargs) -> Charge:
    return Charge("k", limit(**kwargs), amount, NOW)


def test_period_instances_and_ranges() -> None:
    assert [period_key(p, NOW) for p in ("minute", "day", "month")] == ["w60", "d2026-11-30", "M2026-11"]  # a rate window never rolls over
    assert period_range("M2026-11") == (dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    assert period_range("d2026-11-30")[1] == period_end("day", NOW) == dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    assert period_end("minute", NOW) == NOW + dt.timedelta(seconds=60)  # when an entry made now leaves its window
    assert period_end("month", dt.datetime(2026, 12, 15, tzinfo=dt.UTC)) == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def test_a_period_instance_is_spelled_as_strftime_spells_it_in_utc() -> None:
    """Counter keys are stored: a new spelling would start every counter over."""
    zones = [dt.UTC, dt.timezone(dt.timedelta(hours=-5)), dt.timezone(dt.timedelta(hours=13, minutes=45))]
    moments = [dt.datetime(2026, 12, 31, 23, 30), dt.datetime(2027, 1, 1, 0, 15), dt.datetime(999, 3, 4, 12), dt.datetime(2028, 2, 29, 6)]
    for moment in moments:
        for zone in zones:
            when = moment.replace(tzinfo=zone)
            utc = when.astimezone(dt.UTC)
            assert period_key("day", when) == utc.strftime("d%Y-%m-%d")
            assert period_key("month", when) == utc.strftime("M%Y-%m")


def test_bound_is_the_dearest_target() -> None:
    prices = PriceTable(
        [
            {"provider": "a", "model": "cheap", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "5"}},
            {"provider": "b", "model": "dear", "effective_from": "2025-01-01", "usd_per_mtok": {"input": "3", "output": "15"}},
        ]
    )
    on = NOW.date()
    bound = bound_for([(1000, 500, prices.price_for("a", "cheap", None, on)), (800, 600, prices.price_for("b", "dear", None, on))], "x")
    assert bound == Bound(tokens=1500, cost_micro_usd=800 * 3 + 600 * 15, estimate="x")


def test_hard_soft_and_warn() -> None:
    assert judge([charge(30)], {"k": 70}).blocked is None  # exactly at the limit is within it
    assert judge([charge(31)], {"k": 70}).blocked is not None
    assert judge([charge(500, hard=False)], {"k": 99}).blocked is None  # a soft cap admits while below
    assert judge([charge(1, hard=False)], {"k": 100}).blocked is not None
    verdict = judge([charge(10, block=None, warn=50)], {"k": 45})
    assert verdict.blocked is None and len(verdict.warnings) == 1


def test_charges_follow_the_counters() -> None:
    limits = Limits((limit("requests", "minute"), limit("tokens", "day"), limit("cost", "month")))
    amounts = {c.limit.metric: (c.amount, c.key) for c in charges(limits, Bound(1234, 5678, "x"), NOW)}
    assert amounts == {
        "requests": (1, "team:t|requests|w60"),
        "tokens": (1234, "team:t|tokens|d2026-11-30"),
        "cost": (5678, "team:t|cost|M2026-11"),
    }


def test_refusals_say_what_and_when() -> None:
    budget = refusal(charge(1), NOW)
    assert budget.kind.status == 402 and budget.code == "budget_exceeded" and budget.retry_after == 30
    rate = refusal(Charge("k", limit("requests", "minute"), 1, NOW), NOW, retry_after_ms=12_001)
    assert rate.kind.status == 429 and rate.retry_after == 13 and "request rate" in rate.message  # when enough of the window has left


def test_thresholds_reached() -> None:
    record = {"ceiling": 1000, "thresholds": [80, 95]}
    assert reached_thresholds(record, 799) == [] and reached_thresholds(record, 800) == [80] and reached_thresholds(record, 2000) == [80, 95]
    assert reached_thresholds({"ceiling": None, "thresholds": [80]}, 10**9) == []


def test_upper_bound_sizing_never_undercounts_tiktoken() -> None:
    texts = ["The quarterly report shows growth.", "分析四半期報告書，總結三個要點。", " ".join(str(i) for i in range(300)), "🙂" * 40]
    for text in texts:
        body = {"messages": [{"role": "user", "content": text}]}
        upper, method = count_input_tokens(body, exact_for_openai=False)
        counted, exact = count_input_tokens(body, exact_for_openai=True)
        assert method == UPPER_BOUND and exact == TIKTOKEN
        assert upper >= counted


def test_images_count_a_fixed_allowance_not_their_bytes() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 400_000}}
    tokens, _ = count_input_tokens({"messages": [{"role": "user", "content": [image]}]}, exact_for_openai=False)
    assert IMAGE_TOKENS <= tokens < IMAGE_TOKENS + 100
    url = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400_000}}
    tokens, _ = count_input_tokens({"messages": [{"role": "user", "content": [url]}]}, exact_for_openai=True)
    assert IMAGE_TOKENS <= tokens < IMAGE_TOKENS + 100


@pytest.mark.parametrize("exact", [False, True])
def test_tools_and_system_are_counted(exact: bool) -> None:
    bare = {"messages": [{"role": "user", "content": "hi"}]}
    rich = {**bare, "system": "You are terse." * 50, "tools": [{"name": "t", "description": "d" * 400, "input_schema": {"type": "object"}}]}
    assert count_input_tokens(rich, exact)[0] > count_input_tokens(bare, exact)[0] + 50


def test_a_window_frees_room_as_its_oldest_entries_leave() -> None:
    rpm = Charge("k", limit("requests", "minute", block=3), 1, NOW)
    entries = [(1_000, 1), (5_000, 1), (9_000, 1)]  # full: the oldest must leave first
    assert window_wait_ms(entries, 3, rpm, now_ms=30_000) == 1_000 + 60_000 - 30_000
    tpm = Charge("k", limit("tokens", "minute", block=100), 50, NOW)
    assert window_wait_ms([(1_000, 30), (2_000, 30), (3_000, 40)], 100, tpm, now_ms=10_000) == 2_000 + 60_000 - 10_000  # 60 tokens must leave
    soft = Charge("k", limit("requests", "minute", block=2, hard=False), 1, NOW)
    assert window_wait_ms([(4_000, 1), (6_000, 1)], 2, soft, now_ms=7_000) == 4_000 + 60_000 - 7_000


def test_converse_images_and_documents_are_sized_as_the_other_protocols_size_them() -> None:
    image = {"image": {"format": "png", "source": {"bytes": "A" * 200_000}}}
    document = {"document": {"format": "pdf", "name": "report", "source": {"bytes": "A" * 40_000}}}
    converse, _ = count_input_tokens({"messages": [{"role": "user", "content": [{"text": "hi"}, image, document]}]}, False)
    messages, _ = count_input_tokens(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image", "source": {"type": "base64", "data": "A" * 200_000}},
                        {"type": "document", "source": {"type": "base64", "data": "A" * 40_000}},
                    ],
                }
            ]
        },
        False,
    )
    assert converse < 20_000  # the image's base64 is not counted as text
    assert abs(converse - messages) < 100  # only member names differ
