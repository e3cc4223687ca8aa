"""Rate limits are sliding 60-second windows, on both ledgers: no 60-second span holds
more than the limit, wherever it starts, so a burst straddling a minute boundary is not
admitted twice. Time is injected through the reservations' own timestamps."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.engine.governance import WINDOW_MS, Bound, CounterLimit, Limits, charges
from tests.test_unit_ledger import with_ledger  # noqa: F401  (the fixture: embedded and shared ledgers)

# Just before a calendar minute ends, in the future so the real clock never interferes.
EDGE = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(second=58, microsecond=0)


def rate(team: str, rpm: int | None = None, tpm: int | None = None) -> Limits:
    counters = []
    if rpm is not None:
        counters.append(CounterLimit(f"team:{team}", "requests", "minute", rpm, None, True, ("rate",), ()))
    if tpm is not None:
        counters.append(CounterLimit(f"team:{team}", "tokens", "minute", tpm, None, True, ("rate",), ()))
    return Limits(counters=tuple(counters))


def at(team: str, limits: Limits, when: dt.datetime, tokens: int = 100) -> Reservation:
    request_id = f"req_{uuid.uuid4().hex[:12]}"
    bound = Bound(tokens=tokens, cost_micro_usd=0, estimate="test")
    return Reservation(request_id, request_id, "main", {"team": team, "user": None, "key_id": "key_x"}, tuple(charges(limits, bound, when)), bound, when)


def seconds(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


def test_a_burst_straddling_a_minute_boundary_gets_the_limit_once(with_ledger) -> None:  # noqa: F811
    team = f"t{uuid.uuid4().hex[:8]}"
    limits = rate(team, rpm=5)

    async def body(ledger: Any) -> None:
        before = [await ledger.reserve(at(team, limits, EDGE + seconds(0.2 * i))) for i in range(5)]  # :58.0 … :58.8
        assert all(v.blocked is None for v in before)
        after = [await ledger.reserve(at(team, limits, EDGE + seconds(2.5 + 0.1 * i))) for i in range(5)]  # the next calendar minute
        assert all(v.blocked is not None for v in after)  # a calendar-minute counter would have admitted all five
        assert after[0].retry_after_ms == WINDOW_MS - 2_500  # when the first entry, from :58.0, leaves
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(59.9)))).blocked is not None
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(60.0)))).blocked is None  # :58.0 has left: one slot
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(60.1)))).blocked is not None

    with_ledger(body)


def test_no_sixty_second_span_holds_more_than_the_limit(with_ledger) -> None:  # noqa: F811
    team = f"t{uuid.uuid4().hex[:8]}"
    rpm = 7
    limits = rate(team, rpm=rpm)

    async def body(ledger: Any) -> None:
        admitted: list[int] = []
        offset = 0.0
        for i in range(240):  # uneven arrivals over three minutes, bunched around the boundaries
            offset += 0.05 if i % 40 < 20 else 1.3
            when = EDGE + seconds(offset)
            if (await ledger.reserve(at(team, limits, when))).blocked is None:
                admitted.append(int(when.timestamp() * 1000))
        assert len(admitted) >= 3 * rpm  # the limit is used, not just enforced
        for start in admitted:  # every span that starts at an admission, the worst case
            assert sum(1 for t in admitted if start <= t < start + WINDOW_MS) <= rpm

    with_ledger(body)


def test_a_token_window_holds_the_settled_usage_until_it_leaves(with_ledger) -> None:  # noqa: F811
    team = f"t{uuid.uuid4().hex[:8]}"
    limits = rate(team, tpm=2_000)

    async def body(ledger: Any) -> None:
        first = at(team, limits, EDGE, tokens=1_500)
        assert (await ledger.reserve(first)).blocked is None
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(1), tokens=1_000))).blocked is not None
        amounts = {c.key: 300 for c in first.charges}
        await ledger.settle(first.id, first.charge_records(), Final("settled", 300, 0, amounts))  # the bound gives way to the usage
        second = at(team, limits, EDGE + seconds(2), tokens=1_000)
        assert (await ledger.reserve(second)).blocked is None
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(3), tokens=600))).blocked is None  # 300 + 1,000 + 600
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(4), tokens=200))).blocked is not None
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(60.5), tokens=300))).blocked is None  # the 300 has left: 1,000 + 600 + 300
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(60.6), tokens=200))).blocked is not None
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(62.5), tokens=100))).blocked is None  # the 1,000 has left: 600 + 300 + 100
        # A settlement of an entry that has left its window cannot take anything off the total.
        await ledger.settle(second.id, second.charge_records(), Final("settled", 100, 0, {c.key: 100 for c in second.charges}))
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(62.6), tokens=1_000))).blocked is None  # exactly 2,000
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(62.7), tokens=1))).blocked is not None

    with_ledger(body)


@pytest.mark.parametrize("with_ledger", ["shared"], indirect=True)
def test_a_lost_window_is_rebuilt_from_the_ledger(with_ledger) -> None:  # noqa: F811
    team = f"t{uuid.uuid4().hex[:8]}"
    limits = rate(team, rpm=3)

    async def body(ledger: Any) -> None:
        for i in range(3):
            assert (await ledger.reserve(at(team, limits, EDGE + seconds(i)))).blocked is None
        assert await ledger.reload_counters() > 0  # as if Redis had been flushed
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(10)))).blocked is not None  # rebuilt from PostgreSQL
        assert (await ledger.reserve(at(team, limits, EDGE + seconds(60.0)))).blocked is None  # and it still slides

    with_ledger(body)
