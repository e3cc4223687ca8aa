"""``portcullis.budget.utilisation`` against real ledgers (SQLite, write-behind, Redis +
PostgreSQL): the counters it reads are the ones requests charge (checked against the
plans' own), spend reserved and settled through the ledger shows as the fraction of
each limit with only the bundle's names as labels, per-user limits never become a
label, and a store that fails keeps the refresh task alive while its values age out."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.capacity import MemoryCapacity
from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.telemetry import prometheus
from portcullis.adapters.telemetry.budget_gauge import BudgetGauge
from portcullis.adapters.telemetry.config import MetricsConfig, TelemetryConfig
from portcullis.adapters.telemetry.registry import Registry
from portcullis.adapters.telemetry.serving import Telemetry
from portcullis.adapters.telemetry.store_gauges import StoreGauges
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.governance import MINUTE, Bound, charges
from portcullis.engine.team_counters import team_counters
from tests.budget_tier_helpers import CHEAP, TIERED, tiered_catalog
from tests.bundles import TENANTS, deep_copy, write_bundle
from tests.metrics_helpers import only, samples, value
from tests.test_unit_ledger import open_ledger

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}
UTILISATION = "portcullis_budget_utilisation_ratio"
USER, KEY = "alice-7f3e9c", "key_0123456789abcdef"


def rules_for(team: str) -> dict[str, Any]:
    return {
        f"{team}-cap": {"subject": {"team": team}, "budget": {"limit_usd": "1.00", "period": "CalendarMonth"}},
        f"{team}-cap-loose": {"subject": {"team": team}, "budget": {"limit_usd": "4.00", "period": "CalendarMonth"}},  # merges: $1 governs
        f"{team}-soft": {"subject": {"team": team}, "budget": {"limit_usd": "2.00", "period": "CalendarDay"}, "failure_policy": "Warn"},
        f"{team}-quota": {"subject": {"team": team}, "quota": {"tokens_per_day": 10_000}},
        f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 100}},  # a window: not read
        f"{team}-per-user": {"subject": {"team": team, "per": "user"}, "budget": {"limit_usd": "5", "period": "CalendarDay"}},
        f"{team}-{USER}": {"subject": {"team": team, "user": USER}, "budget": {"limit_usd": "5", "period": "CalendarDay"}},
        "org-cap": {"subject": {}, "budget": {"limit_usd": "10", "period": "CalendarMonth"}},
        "ops-cap": {"subject": {"team": "ops"}, "budget": {"limit_usd": "3", "period": "CalendarDay"}},
        "ghost-cap": {"subject": {"team": "ghost"}, "budget": {"limit_usd": "3", "period": "CalendarDay"}},  # no such team
    }


def load(tmp_path: Path, team: str, rules: dict[str, Any] | None = None) -> ActiveBundle:
    tenants = deep_copy(TENANTS)
    for name in (team, "ops"):
        tenants["teams"][name] = {"models": [TIERED, CHEAP]}
    directory = write_bundle(tmp_path / f"bundle-{uuid.uuid4().hex[:6]}", tenants, tiered_catalog(), governance=rules if rules is not None else rules_for(team))
    return activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, dt.date.today())


def principal(team: str, user: str | None = USER) -> dict[str, Any]:
    return {"team": team, "user": user, "key_id": KEY}


async def spend(ledger: Any, active: ActiveBundle, who: dict[str, Any], bound: int, cost: int | None, tokens: int = 2_500) -> Reservation:
    """Reserve ``bound`` micro-USD (and 5,000 tokens) on every counter the plan charges,
    as governance does; with ``cost``, settle it at that."""
    limits = active.decide({"principal": who, "request": {"model": TIERED, "requires": []}}).limits
    now = dt.datetime.now(dt.UTC)
    request_id = f"req_{uuid.uuid4().hex[:12]}"
    reservation = Reservation(request_id, request_id, "main", who, tuple(charges(limits, Bound(5_000, bound, "test"), now)), Bound(5_000, bound, "test"), now)
    assert (await ledger.reserve(reservation)).blocked is None
    if cost is not None:
        await settle(ledger, reservation, cost, tokens)
    return reservation


async def settle(ledger: Any, reservation: Reservation, cost: int, tokens: int) -> None:
    amounts = {c.key: {"cost": cost, "requests": 1, "tokens": tokens}[c.limit.metric] for c in reservation.charges}
    final = Final("settled", tokens, cost, amounts, {"input": 0, "output": tokens}, {"provider": "p", "model": "m", "region": "r"})
    await ledger.settle(reservation.id, reservation.charge_records(), final)


def gauge_for(ledger: Any, active: ActiveBundle, **kwargs: Any) -> tuple[Registry, BudgetGauge]:
    registry = Registry()
    return registry, BudgetGauge(registry, ledger, lambda: active, lambda: dt.datetime.now(dt.UTC), **kwargs)


def rendered(registry: Registry) -> str:
    return prometheus.render(registry.snapshot())


async def eventually(condition: Any, seconds: float = 5.0) -> bool:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return bool(condition())


def test_the_counters_read_are_the_ones_requests_charge(tmp_path: Path) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"
    active = load(tmp_path, team)
    counters = team_counters(active.bundle.data["portcullis"])
    for who in (principal(team), principal(team, None), principal("ops", "bob")):
        plan = active.decide({"principal": who, "request": {"model": TIERED, "requires": []}})
        charged = {
            (c.scope, c.metric, c.period, c.block if c.block is not None else c.warn, c.rules)
            for c in plan.limits.counters
            if (c.scope == "org" or c.scope.startswith("team:")) and c.period != MINUTE
        }
        read = {(c.scope, c.metric, c.period, c.ceiling, c.rules) for c in counters if c.team in (who["team"], None)}
        assert read == charged
    assert {c.scope for c in counters} == {f"team:{team}", "team:ops", "org"}  # no user, key or unknown team
    assert len(counters) == 5  # team: cost/month, cost/day, tokens/day; ops: cost/day; org: cost/month


@pytest.mark.parametrize("kind", ["embedded", "write-behind", "shared"])
def test_reserved_and_settled_spend_shows_as_the_fraction_of_each_limit(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    services = request.getfixturevalue("services") if kind == "shared" else None
    team = f"t{uuid.uuid4().hex[:8]}"  # the session's PostgreSQL is shared: counters of a team of its own
    active = load(tmp_path, team)

    async def main() -> None:
        async with open_ledger(kind, tmp_path, services) as ledger:
            registry, gauge = gauge_for(ledger, active)
            await gauge.refresh()
            assert only(rendered(registry), UTILISATION, portcullis_team=team, metric="cost", period="month") == 0  # nothing charged yet: 0, not unknown
            big = await spend(ledger, active, principal(team), bound=900_000, cost=None)
            await gauge.refresh()
            text = rendered(registry)
            assert value(text, UTILISATION, portcullis_team=team, metric="cost", period="month") == pytest.approx(0.9)  # an open reservation counts
            small = await spend(ledger, active, principal(team, None), bound=100_000, cost=None)
            await gauge.refresh()
            assert value(rendered(registry), UTILISATION, portcullis_team=team, metric="cost", period="month") == pytest.approx(1.0)
            await settle(ledger, big, 830_000, 2_500)  # settled below their bounds: the counters fall
            await settle(ledger, small, 0, 0)
            await gauge.refresh()
            text = rendered(registry)
            wanted = {
                (team, "team", "cost", "month", f"{team}-cap,{team}-cap-loose"): 0.83,  # $0.83 of the strictest $1.00
                (team, "team", "cost", "day", f"{team}-soft"): 0.415,  # a Warn-only limit: its own ceiling
                (team, "team", "tokens", "day", f"{team}-quota"): 0.25,
            }
            found = {tuple(labels.values()): v for name, labels, v in samples(text) if name == UTILISATION and labels["portcullis_team"] == team}
            assert found == pytest.approx(wanted)
            if kind != "shared":  # the shared org counter is every test's in this session's PostgreSQL
                assert value(text, UTILISATION, scope="org", portcullis_team="") == pytest.approx(0.083)
            assert only(text, UTILISATION, portcullis_team="ops", metric="cost", period="day") == 0  # its budget, untouched: 0, not unknown
            _only_bundle_labels(text, active, team)

    asyncio.run(main())


def _only_bundle_labels(text: str, active: ActiveBundle, team: str) -> None:
    rules = set(active.bundle.data["portcullis"]["governance"]["rules"])
    for name, labels, _ in samples(text):
        if name != UTILISATION:
            continue
        assert labels["portcullis_team"] in {team, "ops", ""}
        assert labels["scope"] in {"team", "org"} and labels["metric"] in {"cost", "tokens"} and labels["period"] in {"day", "month"}
        assert set(labels["rule"].split(",")) <= rules
    assert USER not in text and KEY not in text and "ghost" not in text


def test_a_per_user_limit_never_puts_a_user_in_a_label(tmp_path: Path) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"
    per_user_only = {k: v for k, v in rules_for(team).items() if k in (f"{team}-per-user", f"{team}-{USER}", f"{team}-rate")}
    active = load(tmp_path, team, per_user_only)

    async def main() -> None:
        async with open_ledger("embedded", tmp_path, None) as ledger:
            await spend(ledger, active, principal(team), bound=400_000, cost=300_000)
            await spend(ledger, active, principal(team, "bob-1d2c"), bound=400_000, cost=300_000)
            registry, gauge = gauge_for(ledger, active)
            await gauge.refresh()
            text = rendered(registry)
            assert [s for s in samples(text) if s[0] == UTILISATION] == []  # left out, not summarised under a user
            assert USER not in text and "bob-1d2c" not in text and KEY not in text

    asyncio.run(main())


class Flaky:
    """A real ledger whose reads fail while ``down``, as an unreachable store's do."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.down = False
        self.reads = 0

    async def values(self, keys: list[str]) -> dict[str, int]:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("the counters are unavailable at redis://portcullis:hunter2@10.0.0.5")
        return await self.ledger.values(keys)


def test_a_failed_read_keeps_the_last_values_until_they_are_stale(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"
    active = load(tmp_path, team)
    clock = [1_000.0]

    async def main() -> None:
        async with open_ledger("embedded", tmp_path, None) as ledger:
            await spend(ledger, active, principal(team), bound=500_000, cost=500_000)
            flaky = Flaky(ledger)
            registry, gauge = gauge_for(flaky, active, stale_seconds=300, monotonic=lambda: clock[0])
            await gauge.refresh()
            month = {"portcullis_team": team, "metric": "cost", "period": "month"}
            assert value(rendered(registry), UTILISATION, **month) == pytest.approx(0.5)
            flaky.down = True
            for _ in range(3):
                clock[0] += 90
                await gauge.refresh()  # never raises
            assert value(rendered(registry), UTILISATION, **month) == pytest.approx(0.5)  # 270 s old: kept
            clock[0] += 40
            assert [s for s in samples(rendered(registry)) if s[0] == UTILISATION] == []  # 310 s old: dropped
            flaky.down = False
            await gauge.refresh()
            assert value(rendered(registry), UTILISATION, **month) == pytest.approx(0.5)

    with caplog.at_level(logging.INFO, logger="portcullis.metrics"):
        asyncio.run(main())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "StoreUnavailable" in caplog.text  # once per outage, by the error's type
    assert "hunter2" not in caplog.text and "10.0.0.5" not in caplog.text
    assert "readable again" in caplog.text


def test_the_refresh_task_outlives_a_failing_store_and_stops_with_telemetry(tmp_path: Path) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"
    active = load(tmp_path, team)

    async def main() -> None:
        async with open_ledger("embedded", tmp_path, None) as ledger:
            await spend(ledger, active, principal(team), bound=250_000, cost=250_000)
            flaky = Flaky(ledger)
            flaky.down = True
            gauges = StoreGauges(Registry(), flaky, MemoryCapacity(), {}, lambda: active, lambda: dt.datetime.now(dt.UTC), refresh_seconds=0.01)
            refresh, bugs = gauges.budgets.refresh, [RuntimeError("a bug"), RuntimeError("another")]

            async def buggy() -> None:  # a fault of the gauge's own, not the store's: the task goes on too
                if bugs:
                    raise bugs.pop()
                await refresh()

            gauges.budgets.refresh = buggy  # type: ignore[method-assign]
            gauges.start()
            assert await eventually(lambda: flaky.reads >= 5)  # read again and again, failing
            assert not bugs
            flaky.down = False
            assert await eventually(lambda: gauges.budgets.observe())
            await gauges.close()
            reads = flaky.reads
            await asyncio.sleep(0.05)
            assert flaky.reads == reads  # stopped

            telemetry = Telemetry(TelemetryConfig(metrics=MetricsConfig()), {}, lambda: active, dict)
            telemetry.watch_store(ledger, MemoryCapacity(), {}, lambda: dt.datetime.now(dt.UTC))
            await telemetry.start()
            assert await eventually(lambda: value(telemetry.render(), UTILISATION, portcullis_team=team, metric="cost", period="month"))
            assert value(telemetry.render(), UTILISATION, portcullis_team=team, metric="cost", period="month") == pytest.approx(0.25)
            assert telemetry.store_gauges is not None
            await telemetry.stop_store_gauges()  # before the store closes
            assert telemetry.store_gauges._task is None
            await telemetry.close()

            off = Telemetry(TelemetryConfig(), {}, lambda: active, dict)
            off.watch_store(ledger, MemoryCapacity(), {}, lambda: dt.datetime.now(dt.UTC))
            assert off.store_gauges is None  # metrics off: no gauge, no task

    asyncio.run(main())
