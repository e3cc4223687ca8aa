"""Each counter instance's high-water mark, on both ledgers against a real SQLite file
and real Redis + PostgreSQL: it rises with the counter in the same atomic step, never
falls within the period (released and settled-lower reservations lower only the
counter), is never below any value the counter held under concurrency, and comes
back from PostgreSQL when Redis loses it."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from tests import test_unit_ledger
from tests.test_unit_ledger import open_ledger, reservation, settled

with_ledger = test_unit_ledger.with_ledger  # the fixture: each test runs on both ledgers


def cost_key(res: Reservation) -> str:
    return next(c.key for c in res.charges if c.limit.metric == "cost")


def released(res: Reservation) -> Final:
    return Final("released", 0, 0, {c.key: 0 for c in res.charges})


def test_the_peak_keeps_the_highest_value_the_counter_held(with_ledger) -> None:
    team = "peaks-a"

    async def body(ledger: Any) -> None:
        first, second = reservation(team, bound=30_000), reservation(team, bound=20_000)
        key = cost_key(first)
        assert (await ledger.peaks([key])).get(key, 0) == 0  # no counter yet: absent, or loaded as 0
        await ledger.reserve(first)
        await ledger.reserve(second)
        assert await ledger.peaks([key]) == {key: 50_000}
        await ledger.settle(first.id, first.charge_records(), settled(first, 1_000))
        await ledger.settle(second.id, second.charge_records(), released(second))
        assert await ledger.counter(key) == 1_000
        assert await ledger.peaks([key]) == {key: 50_000}
        third = reservation(team, bound=60_000)
        await ledger.reserve(third)  # 61 000: above the old peak
        peaks = await ledger.peaks([key, "team:nobody|cost|M2000-01"])
        assert peaks[key] == 61_000 and peaks.get("team:nobody|cost|M2000-01", 0) == 0

    with_ledger(body)


def test_a_settlement_above_the_bound_raises_the_peak(with_ledger) -> None:
    """A reconciliation with the provider's usage can charge more than the bound."""
    team = "peaks-f"

    async def body(ledger: Any) -> None:
        res = reservation(team, bound=30_000)
        await ledger.reserve(res)
        await ledger.settle(res.id, res.charge_records(), settled(res, 45_000))
        assert await ledger.peaks([cost_key(res)]) == {cost_key(res): 45_000}

    with_ledger(body)


def test_a_refused_reservation_raises_no_peak(with_ledger) -> None:
    team = "peaks-b"

    async def body(ledger: Any) -> None:
        held = reservation(team, bound=90_000)
        await ledger.reserve(held)
        refused = reservation(team, bound=20_000)  # 110 000 > the 100 000 limit
        assert (await ledger.reserve(refused)).blocked is not None
        assert await ledger.peaks([cost_key(held)]) == {cost_key(held): 90_000}

    with_ledger(body)


async def concurrent_traffic(ledger: Any, team: str, workers: int, rounds: int, observed: list[int], seed: int) -> None:
    """Reserve, then settle low or release, in random order, sampling the counter."""
    rng = random.Random(seed)

    async def one() -> None:
        for _ in range(rounds):
            res = reservation(team, bound=rng.randrange(1_000, 9_000))
            if (await ledger.reserve(res)).blocked is None:
                observed.append(await ledger.counter(cost_key(res)))
                await asyncio.sleep(rng.random() / 1000)
                final = released(res) if rng.random() < 0.5 else settled(res, rng.randrange(0, 500))
                await ledger.settle(res.id, res.charge_records(), final)
            observed.append(await ledger.counter(cost_key(res)))

    await asyncio.gather(*(one() for _ in range(workers)))


def test_the_peak_is_never_below_a_value_the_shared_counter_held(tmp_path: Path, services) -> None:
    team, observed = "peaks-c", []

    async def main() -> None:
        async with open_ledger("shared", tmp_path, services) as ledger:
            await concurrent_traffic(ledger, team, workers=12, rounds=15, observed=observed, seed=3)
            key = cost_key(reservation(team))
            peak = (await ledger.peaks([key]))[key]
            assert max(observed) > await ledger.counter(key)  # the counter did fall back
            assert peak >= max(observed)
            assert peak <= 12 * 9_000 + 12 * 15 * 500  # never above what could be open at once plus all settled

    asyncio.run(main())


def test_the_peak_is_never_below_a_value_the_embedded_counter_held(tmp_path: Path) -> None:
    """Several connections to one file (as several processes would), each on a thread."""
    team, observed, errors = "peaks-d", [], []
    SqliteKeyStore.open(tmp_path / "ledger.db")  # migrated once

    def worker(seed: int) -> None:
        try:
            store = SqliteKeyStore.open(tmp_path / "ledger.db")
            asyncio.run(concurrent_traffic(SqliteLedger(store.connection), team, workers=3, rounds=15, observed=observed, seed=seed))
            asyncio.run(store.close())
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    store = SqliteKeyStore.open(tmp_path / "ledger.db")
    ledger = SqliteLedger(store.connection)
    key = cost_key(reservation(team))
    peak = asyncio.run(ledger.peaks([key]))[key]
    assert max(observed) > asyncio.run(ledger.counter(key))
    assert peak >= max(observed)


def test_a_peak_redis_lost_comes_back_from_postgres(tmp_path: Path, services) -> None:
    team = "peaks-e"

    async def main() -> None:
        async with open_ledger("shared", tmp_path, services) as ledger:
            first, second = reservation(team, bound=30_000), reservation(team, bound=30_000)
            key = cost_key(first)
            for res in (first, second):
                await ledger.reserve(res)
            for res in (first, second):
                await ledger.settle(res.id, res.charge_records(), settled(res, 1_000))
            assert await ledger.peaks([key]) == {key: 60_000}
            assert await ledger.reload_counters() > 0  # what a flushed or replaced Redis looks like
            assert await ledger.counter(key) == 0  # gone from Redis
            # Read before any reservation: loaded with its counter, replaying the period's reservations.
            assert await ledger.peaks([key]) == {key: 60_000}
            assert await ledger.counter(key) == 2_000
            third = reservation(team, bound=5_000)
            await ledger.reserve(third)
            assert await ledger.counter(key) == 7_000
            assert await ledger.peaks([key]) == {key: 60_000}
            assert await ledger.reload_counters() > 0
            await ledger.reserve(reservation(team, bound=5_000))  # or by a reservation, whichever comes first
            assert await ledger.peaks([key]) == {key: 60_000}

    asyncio.run(main())


def test_an_existing_counter_gets_its_value_as_its_peak_when_migrated(tmp_path: Path) -> None:
    """The migration starts every counter's peak at its value."""
    import sqlite3

    from portcullis.adapters.store import migration_files
    from portcullis.adapters.store.sqlite import migrate

    connection = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    connection.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for version, name, sql in migration_files("sqlite"):
        if "peak" in name:
            break
        connection.executescript(f"BEGIN;\n{sql}\nINSERT INTO schema_migrations VALUES ({version}, '{name}', 'then');\nCOMMIT;")
    connection.execute("INSERT INTO counters (key, value, expires_at) VALUES ('team:x|cost|M2026-12', 4200, '2099-01-01')")
    assert any("peak" in name for name in migrate(connection))
    assert asyncio.run(SqliteLedger(connection).peaks(["team:x|cost|M2026-12"])) == {"team:x|cost|M2026-12": 4200}
