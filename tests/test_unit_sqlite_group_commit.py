"""Group commit in the embedded ledger, against real SQLite files: writes that arrive
together share one transaction, yet each is judged on what the writes before it left, a
refused one holds nothing, a failing one fails alone, and a hard cap holds under
concurrency within one process and across two processes hammering one file."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from portcullis.engine.governance import Bound, CounterLimit, Limits, charges

ROOT = Path(__file__).resolve().parent.parent


def capped(team: str, cap: int) -> Limits:
    """A hard monthly cost cap and a generous request-rate window (both kinds of counter)."""
    return Limits(
        (
            CounterLimit(f"team:{team}", "cost", "month", cap, None, True, ("cap",), (50,)),
            CounterLimit(f"team:{team}", "requests", "minute", 1_000_000, None, True, ("rate",), ()),
        )
    )


def reservation(team: str, cost: int, cap: int, reservation_id: str | None = None) -> Reservation:
    now = dt.datetime.now(dt.UTC)
    bound = Bound(100, cost, "test")
    rid = reservation_id or f"req_{uuid.uuid4().hex[:16]}"
    return Reservation(rid, rid, "main", {"team": team, "user": None, "key_id": "key_x"}, tuple(charges(capped(team, cap), bound, now)), bound, now)


def rows(path: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql, args).fetchall()


def run(path: Path, body: Callable[[SqliteLedger, Path], Awaitable[None]]) -> None:
    async def main() -> None:
        store = SqliteKeyStore.open(path)
        try:
            await body(SqliteLedger(store.connection), path)
        finally:
            await store.close()

    asyncio.run(main())


def test_a_batch_judges_each_write_on_the_ones_before_it(tmp_path: Path) -> None:
    """With a request in flight, four reservations arriving together commit in one
    transaction: in arrival order, the two that fit are admitted, the two that no
    longer fit are refused and hold nothing."""
    team = "batch-a"

    async def body(ledger: SqliteLedger, path: Path) -> None:
        held = reservation(team, 30_000, 100_000)
        assert (await ledger.reserve(held)).blocked is None  # in flight: what follows is batched
        batches, writes = ledger._writes.batches, ledger._writes.writes
        arriving = [reservation(team, 30_000, 100_000) for _ in range(4)]
        verdicts = await asyncio.gather(*(ledger.reserve(r) for r in arriving))
        assert [v.blocked is None for v in verdicts] == [True, True, False, False]
        assert (ledger._writes.batches - batches, ledger._writes.writes - writes) == (1, 4)  # one commit for the four
        cost_key = held.charges[0].key
        assert await ledger.counter(cost_key) == 90_000
        assert await ledger.counter(held.charges[1].key) == 3  # the refused two did not count as requests either
        recorded = {r for (r,) in rows(path, "SELECT id FROM reservations")}
        assert recorded == {held.id, arriving[0].id, arriving[1].id}
        # A settlement in the next batch frees room for a reservation behind it in the same batch.
        refund = Final("settled", 10, 1_000, {cost_key: 1_000, held.charges[1].key: 1})
        outcome, late = await asyncio.gather(ledger.settle(held.id, held.charge_records(), refund), ledger.reserve(reservation(team, 30_000, 100_000)))
        assert outcome.state == "settled" and late.blocked is None
        assert await ledger.counter(cost_key) == 91_000

    run(tmp_path / "ledger.db", body)


def test_a_write_that_fails_in_a_batch_fails_alone(tmp_path: Path) -> None:
    """A reservation whose id is already recorded fails (the durable record refuses it)
    and its counter changes are undone; the others in its transaction commit."""
    team = "batch-b"

    async def body(ledger: SqliteLedger, path: Path) -> None:
        held = reservation(team, 10_000, 100_000)
        await ledger.reserve(held)
        duplicate = reservation(team, 20_000, 100_000, reservation_id=held.id)
        fine = reservation(team, 5_000, 100_000)
        outcomes = await asyncio.gather(ledger.reserve(duplicate), ledger.reserve(fine), return_exceptions=True)
        assert isinstance(outcomes[0], sqlite3.IntegrityError)
        assert outcomes[1].blocked is None
        assert await ledger.counter(held.charges[0].key) == 15_000  # the duplicate's 20,000 rolled back with it
        assert rows(path, "SELECT count(*) FROM reservations") == [(2,)]
        assert rows(path, "SELECT count(*) FROM window_entries") == [(2,)]

    run(tmp_path / "ledger.db", body)


def test_a_reservation_abandoned_while_queued_is_not_recorded_but_a_settlement_is(tmp_path: Path) -> None:
    """A caller cancelled before its batch runs: its reservation is never made (nothing
    was dispatched), but a settlement, once asked for, is written all the same."""
    team = "batch-c"

    async def body(ledger: SqliteLedger, path: Path) -> None:
        held = reservation(team, 10_000, 100_000)
        await ledger.reserve(held)
        abandoned = reservation(team, 20_000, 100_000)
        reserving = asyncio.create_task(ledger.reserve(abandoned))
        await asyncio.sleep(0)  # queued, its batch not yet run
        reserving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reserving
        assert rows(path, "SELECT count(*) FROM reservations WHERE id = ?", abandoned.id) == [(0,)]
        assert await ledger.counter(held.charges[0].key) == 10_000
        await ledger.reserve(reservation(team, 1_000, 100_000))  # two in flight: the settlement below is batched
        final = Final("settled", 10, 2_000, {held.charges[0].key: 2_000, held.charges[1].key: 1})
        settling = asyncio.create_task(ledger.settle(held.id, held.charge_records(), final))
        await asyncio.sleep(0)
        settling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settling
        assert rows(path, "SELECT state FROM reservations WHERE id = ?", held.id) == [("settled",)]
        assert await ledger.counter(held.charges[0].key) == 3_000

    run(tmp_path / "ledger.db", body)


def test_a_hard_cap_holds_under_many_concurrent_reservations(tmp_path: Path) -> None:
    team = "batch-d"

    async def body(ledger: SqliteLedger, path: Path) -> None:
        first = reservation(team, 1_000, 100_000)
        await ledger.reserve(first)

        async def request(n: int) -> bool:
            await asyncio.sleep(0.001 * (n % 25))  # in waves, so settlements free room for later ones
            res = reservation(team, 1_000, 100_000)
            verdict = await ledger.reserve(res)
            if verdict.blocked is not None:
                return False
            await asyncio.sleep(0)
            await ledger.settle(res.id, res.charge_records(), Final("settled", 10, 500, {res.charges[0].key: 500, res.charges[1].key: 1}))
            return True

        admitted = sum(await asyncio.gather(*(request(n) for n in range(400))))
        key = first.charges[0].key
        value = await ledger.counter(key)
        # Each settled request keeps 500 of its 1,000: the cap admits until its room is gone, never past it.
        assert value == 1_000 + 500 * admitted and value <= 100_000
        assert (await ledger.peaks([key]))[key] <= 100_000
        assert 99 <= admitted < 400  # at least the room there was at the start; some were refused
        assert ledger._writes.batches < ledger._writes.writes  # writes did share commits
        assert rows(path, "SELECT count(*), sum(cost_micro_usd) FROM reservations") == [(1 + admitted, value)]

    run(tmp_path / "ledger.db", body)


HAMMER = """
import asyncio, json, sys
from pathlib import Path
from portcullis.adapters.store.ledger import Final
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from tests.test_unit_sqlite_group_commit import reservation

async def main(path, team, attempts):
    store = SqliteKeyStore.open(Path(path))
    ledger = SqliteLedger(store.connection)
    admitted = []
    print("ready", flush=True)
    sys.stdin.readline()  # both processes start hammering at once

    async def request(n):
        res = reservation(team, 1_000, 60_000)
        if (await ledger.reserve(res)).blocked is not None:
            return
        admitted.append(res.id)
        await asyncio.sleep(0)
        if n % 2:  # half settle lower and free room, half stay open (as in-flight requests would)
            await ledger.settle(res.id, res.charge_records(), Final("settled", 10, 200, {res.charges[0].key: 200, res.charges[1].key: 1}))

    await asyncio.gather(*(request(n) for n in range(attempts)))
    print(json.dumps({"admitted": admitted, "batches": ledger._writes.batches, "writes": ledger._writes.writes}))
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_a_hard_cap_holds_across_two_processes_hammering_one_file(tmp_path: Path) -> None:
    """Two processes, each with 300 concurrent requests against one cap on one file: the
    cap is never passed (its high-water mark stays within it), every admitted
    reservation is recorded, and the counter is exactly what the records charge."""
    path, team = tmp_path / "ledger.db", "batch-e"
    SqliteKeyStore.open(path)  # migrated once, before the processes race
    hammers = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, str(path), team, "300"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for hammer in hammers:  # each imported and opened the file: a slow start must not hand the other the whole cap
        assert hammer.stdout is not None and hammer.stdout.readline().strip() == "ready"
    reports = []
    for hammer in hammers:
        assert hammer.stdin is not None
        hammer.stdin.write("go\n")
        hammer.stdin.flush()
    for hammer in hammers:
        out, err = hammer.communicate(timeout=120)
        assert hammer.returncode == 0, err[-2000:]
        reports.append(json.loads(out))
    admitted = [rid for report in reports for rid in report["admitted"]]
    assert all(report["admitted"] for report in reports)  # both processes got some of the budget
    assert any(report["batches"] < report["writes"] for report in reports)
    key = reservation(team, 1_000, 60_000).charges[0].key
    [(value, peak)] = rows(path, "SELECT value, peak FROM counters WHERE key = ?", key)
    assert peak <= 60_000 and value <= 60_000
    recorded = dict(rows(path, "SELECT id, cost_micro_usd FROM reservations"))
    assert set(recorded) == set(admitted) and len(admitted) == len(set(admitted))
    assert sum(recorded.values()) == value
    assert len(admitted) < 600  # 600 requests of 1,000 against 60,000: the processes competed for the cap

