"""The ledgers on their own, against a real SQLite file and real Redis + PostgreSQL:
settlement is idempotent, reconciliation resolves once, and auxiliary calls use the
same contract as main calls (a main refusal does not refund them)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.store.postgres import PostgresKeyStore
from portcullis.adapters.store.shared import SharedLedger
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from portcullis.adapters.store.sqlite_write_behind import WriteBehindLedger
from portcullis.engine.governance import Bound, CounterLimit, Limits, charges


def now() -> dt.datetime:
    # Counters expire with their period (a minute for rates): a long test run must not
    # build reservations for a minute that ended before they reach Redis.
    return dt.datetime.now(dt.UTC)


def limits(team: str) -> Limits:
    return Limits(
        counters=(
            CounterLimit(f"team:{team}", "cost", "month", 100_000, None, True, ("cap",), (50,)),
            CounterLimit(f"team:{team}", "requests", "minute", 100, None, True, ("rate",), ()),
        )
    )


def reservation(team: str, bound: int = 30_000, name: str = "main", request_id: str | None = None) -> Reservation:
    request_id = request_id or f"req_{uuid.uuid4().hex[:12]}"
    b = Bound(tokens=1_000, cost_micro_usd=bound, estimate="test")
    return Reservation(
        request_id if name == "main" else f"{request_id}:{name}",
        request_id,
        name,
        {"team": team, "user": None, "key_id": "key_x"},
        tuple(charges(limits(team), b, created := now())),
        b,
        created,
    )


def settled(res: Reservation, cost: int) -> Final:
    amounts = {c.key: {"cost": cost, "requests": 1, "tokens": 200}[c.limit.metric] for c in res.charges}
    return Final("settled", 200, cost, amounts, {"input": 150, "output": 50}, {"provider": "p", "model": "m", "region": "r"})


@asynccontextmanager
async def open_ledger(kind: str, tmp_path: Path, services: Any) -> AsyncIterator[Any]:
    if kind == "embedded":
        store = SqliteKeyStore.open(tmp_path / "ledger.db")
        try:
            yield SqliteLedger(store.connection)
        finally:
            await store.close()
        return
    if kind == "write-behind":
        store = SqliteKeyStore.open(tmp_path / "ledger.db")
        behind = WriteBehindLedger.open(store.connection, tmp_path / "ledger.db")
        assert behind is not None
        try:
            yield behind
        finally:
            await behind.close()
            await store.close()
        return
    keys = await PostgresKeyStore.open(services.database_url)
    client = aioredis.Redis.from_url(services.redis_url)
    try:
        yield SharedLedger(client, keys.pool, f"{services.redis_prefix}ledger-{uuid.uuid4().hex[:6]}:")
    finally:
        await client.aclose()
        await keys.close()


@pytest.fixture(params=["embedded", "write-behind", "shared"])
def with_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Callable[[Any], Awaitable[None]]], None]:
    services = request.getfixturevalue("services") if request.param == "shared" else None

    def run(body: Callable[[Any], Awaitable[None]]) -> None:
        async def main() -> None:
            async with open_ledger(request.param, tmp_path, services) as ledger:
                await body(ledger)

        asyncio.run(main())

    return run


def test_settlement_replay_changes_nothing(with_ledger) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        res = reservation(team)
        assert (await ledger.reserve(res)).blocked is None
        cost_key = res.charges[0].key
        assert await ledger.counter(cost_key) == 30_000
        first = await ledger.settle(res.id, res.charge_records(), settled(res, 12_000))
        assert first.state == "settled" and not first.replayed
        assert await ledger.counter(cost_key) == 12_000
        for _ in range(3):  # a retried settlement, a duplicate message: nothing moves
            again = await ledger.settle(res.id, res.charge_records(), settled(res, 99_999))
            assert again.replayed
        assert await ledger.counter(cost_key) == 12_000
        assert res.id not in {item.id for item in await ledger.unresolved(now() + dt.timedelta(days=1))}

    with_ledger(body)


def test_blocked_reservation_changes_no_counter(with_ledger) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        big = reservation(team, bound=90_000)
        assert (await ledger.reserve(big)).blocked is None
        refused = await ledger.reserve(reservation(team, bound=20_000))
        assert refused.blocked is not None and refused.blocked.limit.metric == "cost"
        assert await ledger.counter(big.charges[0].key) == 90_000
        assert await ledger.counter(big.charges[1].key) == 1  # the refused call did not count as a request either

    with_ledger(body)


def test_threshold_fires_once(with_ledger) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        fired = []
        for _ in range(3):
            res = reservation(team, bound=30_000)
            await ledger.reserve(res)
            fired += (await ledger.settle(res.id, res.charge_records(), settled(res, 30_000))).thresholds
        assert [threshold for _, threshold in fired] == [50]  # 60 % reached on the second; reported once

    with_ledger(body)


def test_pending_then_reconciled_once(with_ledger) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        res = reservation(team)
        await ledger.reserve(res)
        held = Final("pending", res.bound.tokens, res.bound.cost_micro_usd, {c.key: c.amount for c in res.charges})
        assert (await ledger.settle(res.id, res.charge_records(), held)).state == "pending"
        assert await ledger.counter(res.charges[0].key) == 30_000  # never settled as zero
        [item] = [item for item in await ledger.unresolved(now()) if item.id == res.id]  # the ledger may hold other tests' items
        assert item.state == "pending"
        final = Final("reconciled", 100, 4_000, {res.charges[0].key: 4_000, res.charges[1].key: 1}, note="usage from the provider's records")
        assert not (await ledger.settle(item.id, item.charges, final)).replayed
        assert (await ledger.settle(item.id, item.charges, final)).replayed
        assert await ledger.counter(res.charges[0].key) == 4_000
        assert res.id not in {item.id for item in await ledger.unresolved(now() + dt.timedelta(days=1))}

    with_ledger(body)


def test_auxiliary_charge_survives_a_main_refusal(with_ledger) -> None:
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        request_id = f"req_{uuid.uuid4().hex[:12]}"
        classifier = reservation(team, bound=20_000, name="classifier", request_id=request_id)
        assert (await ledger.reserve(classifier)).blocked is None
        await ledger.settle(classifier.id, classifier.charge_records(), settled(classifier, 15_000))
        main = reservation(team, bound=90_000, request_id=request_id)
        assert (await ledger.reserve(main)).blocked is not None  # 15,000 + 90,000 > 100,000
        assert await ledger.counter(classifier.charges[0].key) == 15_000  # the classifier's cost stays

    with_ledger(body)


def test_governance_subcalls_use_the_main_call_contract(tmp_path: Path) -> None:
    """An auxiliary call (a classifier, a router model) is reserved on the request's
    counters and settled; when the main call is then refused, its charge stays."""
    from portcullis.adapters.audit_log import AuditLog
    from portcullis.adapters.auth import Principal
    from portcullis.adapters.governance import Governance
    from portcullis.adapters.pipeline import Exchange
    from portcullis.adapters.policy_input import decide
    from portcullis.adapters.protocols.anthropic_messages import PROTOCOL as anthropic_messages
    from portcullis.adapters.providers.mock import MockProvider
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files
    from portcullis.engine.errors import ErrorKind, GatewayError
    from portcullis.engine.pricing import Usage
    from tests.bundles import write_bundle

    rules = {"eng-cap": {"subject": {"team": "eng"}, "budget": {"limit_usd": "0.50", "period": "CalendarDay"}}}
    providers = {name: MockProvider(name) for name in ("anthropic-us", "anthropic-eu", "openai-main")}
    bundle = activate(parse_bundle(read_bundle_files(write_bundle(tmp_path / "b", governance=rules)), []), providers.keys(), now().date())

    async def main() -> None:
        store = SqliteKeyStore.open(tmp_path / "ledger.db")
        ledger = SqliteLedger(store.connection)
        governance = Governance(ledger, providers, AuditLog(tmp_path / "audit.jsonl"))
        principal = Principal("key_0000000000000001", "eng", None)
        raw = b'{"model": "claude-opus-4-1", "max_tokens": 8000, "messages": [{"role": "user", "content": "hi"}]}'
        request = anthropic_messages.wire.parse(raw, {})
        plan = decide(bundle, principal, request)
        exchange = Exchange("req_aux", anthropic_messages, 0.0, now(), principal=principal, request=request, bundle=bundle, plan=plan, targets=plan.targets)
        aux = await governance.reserve_subcall(exchange, "classifier", Bound(500, 300_000, "test"))
        assert aux is not None and aux.id == "req_aux:classifier"
        assert await governance.settle_subcall(aux, Usage(input=400, output=10), 250_000, exchange.plan.targets[0]) == "settled"
        assert exchange.audit_outcome["charged_micro_usd"] == 250_000  # the request's audit outcome carries its sub-calls' charges
        with pytest.raises(GatewayError) as refused:  # opus: 8,000 output tokens at $75/MTok = $0.60 bound
            await governance.admit(exchange)
        assert refused.value.kind is ErrorKind.PAYMENT_REQUIRED
        cost_key = aux.charges[0].key
        assert await ledger.counter(cost_key) == 250_000
        await store.close()

    asyncio.run(main())


def test_the_journal_records_every_move(tmp_path: Path, services) -> None:
    """The database writes the journal itself: every reservation and state change, whose
    deltas add up to what the reservation is charged now."""
    import sqlite3

    import psycopg

    team = f"t{uuid.uuid4().hex[:8]}"

    async def exercise(ledger: Any) -> str:
        res = reservation(team)
        await ledger.reserve(res)
        await ledger.settle(res.id, res.charge_records(), settled(res, 12_000))
        await ledger.settle(res.id, res.charge_records(), settled(res, 12_000))  # a replay journals nothing
        return res.id

    async def embedded(kind: str = "embedded") -> str:
        async with open_ledger(kind, tmp_path, None) as ledger:
            return await exercise(ledger)

    async def shared() -> str:
        async with open_ledger("shared", tmp_path, services) as ledger:
            return await exercise(ledger)

    reservation_id = asyncio.run(embedded())
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        rows = connection.execute("SELECT entry, cost_delta FROM spend_journal WHERE reservation_id = ? ORDER BY id", (reservation_id,)).fetchall()
    assert rows == [("reserve", 30_000), ("settled", -18_000)]
    reservation_id = asyncio.run(embedded("write-behind"))  # written behind the requests, the same moves
    with sqlite3.connect(tmp_path / "ledger.db") as connection:
        rows = connection.execute("SELECT entry, cost_delta FROM spend_journal WHERE reservation_id = ? ORDER BY id", (reservation_id,)).fetchall()
    assert rows == [("reserve", 30_000), ("settled", -18_000)]
    reservation_id = asyncio.run(shared())
    with psycopg.connect(services.database_url) as connection:
        rows = connection.execute("SELECT entry, cost_delta FROM spend_journal WHERE reservation_id = %s ORDER BY id", (reservation_id,)).fetchall()
    assert rows == [("reserve", 30_000), ("settled", -18_000)]


def test_a_settlement_that_lost_to_reconciliation_changes_no_counter(with_ledger) -> None:
    """A live settlement arriving after reconcile took the reservation over is refused by
    the durable record, and the counters follow the record, not the latecomer."""
    team = f"t{uuid.uuid4().hex[:8]}"

    async def body(ledger: Any) -> None:
        res = reservation(team)
        await ledger.reserve(res)
        [item] = [item for item in await ledger.unresolved(now() + dt.timedelta(seconds=1)) if item.id == res.id]
        kept = Final("reconciled", res.bound.tokens, res.bound.cost_micro_usd, {c["key"]: c["amount"] for c in item.charges}, note="no usage evidence")
        assert not (await ledger.settle(item.id, item.charges, kept)).replayed
        late = await ledger.settle(res.id, res.charge_records(), settled(res, 5_000))
        assert late.replayed and late.state == "reconciled"
        assert await ledger.counter(res.charges[0].key) == 30_000  # the bound the record keeps

    with_ledger(body)


def test_a_reservation_resent_after_a_lost_reply_counts_once(tmp_path: Path, services) -> None:
    """redis-py re-sends a command once on a connection error, which may come after Redis
    ran the script (the reply was lost): the second run must not count the reservation again."""
    team = f"t{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with open_ledger("shared", tmp_path, services) as ledger:
            script = ledger._reserve_script

            async def ran_then_resent(**call: Any) -> Any:
                await script(**call)  # ran; its reply never arrived
                return await script(**call)  # the client's retry

            ledger._reserve_script = ran_then_resent
            res = reservation(team, bound=30_000)
            assert (await ledger.reserve(res)).blocked is None
            assert await ledger.counter(res.charges[0].key) == 30_000
            assert await ledger.counter(res.charges[1].key) == 1
            final = await ledger.settle(res.id, res.charge_records(), settled(res, 12_000))
            assert final.state == "settled"
            assert await ledger.counter(res.charges[0].key) == 12_000

    asyncio.run(main())
