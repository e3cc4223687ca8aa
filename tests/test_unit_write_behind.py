"""The write-behind embedded ledger (one gateway on the file, ``workers: 1``): the file
ends up exactly as writing through leaves it, a crash loses no journaled step, other
writers of the file are followed, and two judges of one file exclude each other."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from portcullis.adapters.store.sqlite_write_behind import FOLLOW_SECONDS, WriteBehindLedger, journal_path, lock_path, open_embedded_ledger, recover
from portcullis.engine.governance import Bound, CounterLimit, Limits, charges

START = dt.datetime.now(dt.UTC).replace(microsecond=0)
TABLES = {
    "counters": "SELECT key, value, expires_at, peak FROM counters ORDER BY key",
    "window_entries": "SELECT counter, reservation_id, at_ms, amount FROM window_entries ORDER BY counter, at_ms, reservation_id",
    "reservations": "SELECT * FROM reservations ORDER BY id",
    "spend_journal": "SELECT reservation_id, entry, tokens_delta, cost_delta, created_at FROM spend_journal ORDER BY id",
    "threshold_events": "SELECT * FROM threshold_events ORDER BY counter, threshold",
    "reconciliations": "SELECT * FROM reconciliations ORDER BY reservation_id",
}


def limits(team: str) -> Limits:
    return Limits(
        counters=(
            CounterLimit(f"team:{team}", "cost", "month", 2_000_000, None, True, ("cap",), (50, 80)),
            CounterLimit(f"team:{team}", "cost", "day", 3_000_000, 1_000_000, True, ("daily",), (90,)),
            CounterLimit(f"team:{team}", "requests", "minute", 12, None, True, ("rate",), ()),
            CounterLimit(f"team:{team}", "tokens", "minute", 9_000, None, True, ("tokens",), ()),
        )
    )


def reservation(team: str, n: int, at: dt.datetime, bound: int) -> Reservation:
    request_id = f"req_{team}_{n:04d}"
    b = Bound(tokens=1_000, cost_micro_usd=bound, estimate="test")
    return Reservation(request_id, request_id, "main", {"team": team, "user": "u", "key_id": "k"}, tuple(charges(limits(team), b, at)), b, at)


def final(res: Reservation, state: str, cost: int, tokens: int = 300) -> Final:
    amounts = {c.key: {"cost": cost, "requests": 1, "tokens": tokens}[c.limit.metric] for c in res.charges}
    return Final(state, tokens, cost, amounts, {"input": 200, "output": tokens - 200}, {"provider": "p", "model": "m", "region": "r"})


class Clock:
    """Time the test moves: reservations a few seconds apart, so windows slide."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now


async def traffic(ledger: Any, clock: Clock, seed: int) -> list[tuple[str, Any]]:
    """Reservations (some refused by the rate window or the caps), settlements of every
    kind, replays, and reconciliations; what each step answered."""
    rng = random.Random(seed)
    answers: list[tuple[str, Any]] = []
    open_ones: list[Reservation] = []
    for n in range(160):
        clock.now += dt.timedelta(seconds=rng.choice([0, 1, 2, 7]))
        res = reservation("t", n, clock.now, rng.choice([2_000, 8_000, 25_000]))
        verdict = await ledger.reserve(res)
        answers.append(("reserve", (verdict.blocked.key if verdict.blocked else None, verdict.retry_after_ms, [c.key for c in verdict.warnings])))
        if verdict.blocked is None:
            open_ones.append(res)
        while open_ones and (len(open_ones) > 3 or rng.random() < 0.5):
            done = open_ones.pop(rng.randrange(len(open_ones)))
            state = rng.choice(["settled", "settled", "pending", "released"])
            outcome = await ledger.settle(done.id, done.charge_records(), final(done, state, rng.randrange(0, 30_000)))
            answers.append(("settle", (outcome.state, outcome.replayed, outcome.thresholds)))
            if rng.random() < 0.2:  # a replay changes nothing
                outcome = await ledger.settle(done.id, done.charge_records(), final(done, state, 1))
                answers.append(("replay", (outcome.state, outcome.replayed)))
    for item in await ledger.unresolved(clock.now + dt.timedelta(seconds=1)):
        kept = Final("reconciled", item.bound_tokens, item.bound_micro_usd, {c["key"]: c["amount"] for c in item.charges}, note="no usage")
        outcome = await ledger.settle(item.id, item.charges, kept)
        answers.append(("reconcile", (item.id, outcome.state, outcome.replayed)))
    answers.append(("peaks", await ledger.peaks([f"team:t|cost|M{START:%Y-%m}", "team:t|requests|w60", "missing"])))
    return answers


def file_rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        return {table: db.execute(sql).fetchall() for table, sql in TABLES.items()}


def run_traffic(path: Path, behind: bool, seed: int) -> list[tuple[str, Any]]:
    async def main() -> list[tuple[str, Any]]:
        clock = Clock()
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, clock) if behind else SqliteLedger(store.connection, clock)
        assert ledger is not None
        try:
            return await traffic(ledger, clock, seed)
        finally:
            await ledger.close()
            await store.close()

    return asyncio.run(main())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_file_ends_as_writing_through_leaves_it(tmp_path: Path, seed: int) -> None:
    through = run_traffic(tmp_path / "through.db", behind=False, seed=seed)
    behind = run_traffic(tmp_path / "behind.db", behind=True, seed=seed)
    assert behind == through  # every verdict, retry-after, warning, outcome and threshold
    expected, written = file_rows(tmp_path / "through.db"), file_rows(tmp_path / "behind.db")
    assert all(expected[table] for table in ("counters", "window_entries", "reservations", "threshold_events", "reconciliations"))
    assert written == expected
    assert any(answer[0] == "reserve" and answer[1][0] is not None for answer in through)  # some were refused


CRASHING = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.test_unit_write_behind import Clock, reservation
    from portcullis.adapters.store.sqlite import SqliteKeyStore
    from portcullis.adapters.store.sqlite_write_behind import WriteBehindLedger

    async def main():
        path = Path({path!r})
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, Clock())
        for n in range(5):  # none settled: in flight, so nothing is flushed yet
            assert (await ledger.reserve(reservation("t", n, Clock()(), 20_000))).blocked is None
        assert ledger.flushes == 0
        os._exit(0)  # the gateway dies before its flush

    asyncio.run(main())
    """
)


def test_a_crash_before_the_flush_loses_no_reservation(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    script = CRASHING.format(root=str(Path(__file__).resolve().parent.parent), path=str(path))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert file_rows(path)["reservations"] == []  # the file never got them
    assert journal_path(path).stat().st_size > 0

    async def main() -> None:
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, Clock())  # applies the journal first
        assert ledger is not None
        unresolved = await ledger.unresolved(dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
        assert sorted(item.id for item in unresolved) == [f"req_t_{n:04d}" for n in range(5)] and {item.state for item in unresolved} == {"open"}
        assert await ledger.counter(f"team:t|cost|M{START:%Y-%m}") == 5 * 20_000
        await ledger.close()
        await store.close()

    asyncio.run(main())
    assert journal_path(path).stat().st_size == 0  # all in the file: emptied on close
    asyncio.run(main())  # opened again: the journal applies nothing twice


def test_another_writer_of_the_file_is_followed(tmp_path: Path) -> None:
    """An operator's SQL (or the CLI's reconcile) between two requests: the next read and
    the next reservation see the file's values, with this ledger's own moves kept."""
    path = tmp_path / "state.db"

    async def main() -> None:
        clock = Clock()
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, clock)
        assert ledger is not None
        first = reservation("t", 1, clock(), 20_000)
        await ledger.reserve(first)
        await ledger.settle(first.id, first.charge_records(), final(first, "settled", 10_000))
        key = f"team:t|cost|M{START:%Y-%m}"
        with sqlite3.connect(path) as other:
            other.execute("UPDATE counters SET value = value + 1985000, peak = 1995000 WHERE key = ?", (key,))
        await asyncio.sleep(2 * FOLLOW_SECONDS)
        clock.now += dt.timedelta(seconds=1)
        assert (await ledger.peaks([key]))[key] == 1_995_000
        refused = await ledger.reserve(reservation("t", 2, clock(), 20_000))  # 1,995,000 + 20,000 > 2,000,000
        assert refused.blocked is not None and refused.blocked.key == key
        await ledger.close()
        await store.close()
        assert dict((k, v) for k, v, _, _ in file_rows(path)["counters"])[key] == 1_995_000

    asyncio.run(main())


def test_two_judges_of_one_file_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "state.db"

    async def main() -> None:
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path)
        assert ledger is not None
        assert WriteBehindLedger.open(store.connection, path) is None  # a second gateway writes through instead ...
        through = SqliteLedger(store.connection, lock=lock_path(path))
        with pytest.raises(StoreUnavailable, match="keeps its ledger in memory"):  # ... and may not reserve beside it
            await through.reserve(reservation("t", 1, dt.datetime.now(dt.UTC), 1_000))
        await ledger.close()
        assert (await through.reserve(reservation("t", 2, dt.datetime.now(dt.UTC), 1_000))).blocked is None  # once it is gone
        assert WriteBehindLedger.open(store.connection, path) is None  # and the other way round
        await through.close()
        await store.close()

    asyncio.run(main())


def test_a_journal_that_cannot_be_written_refuses_the_reservation(tmp_path: Path) -> None:
    path = tmp_path / "state.db"

    async def main() -> None:
        clock = Clock()
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, clock)
        assert ledger is not None
        kept = reservation("t", 1, clock(), 20_000)
        await ledger.reserve(kept)
        journal = ledger._journal
        good_fd = journal._fd
        journal._fd = 987_654  # a descriptor that is not open: every write fails
        with pytest.raises(StoreUnavailable, match="journal cannot be written"):
            await ledger.reserve(reservation("t", 2, clock(), 20_000))
        journal._fd = good_fd
        key = f"team:t|cost|M{START:%Y-%m}"
        assert await ledger.counter(key) == 20_000  # the refused one holds nothing
        await ledger.settle(kept.id, kept.charge_records(), final(kept, "settled", 5_000))
        await ledger.close()
        await store.close()
        assert [row[0] for row in file_rows(path)["reservations"]] == [kept.id]

    asyncio.run(main())


def test_many_in_flight_share_a_flush(tmp_path: Path) -> None:
    path = tmp_path / "state.db"

    async def main() -> None:
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path)
        assert ledger is not None
        made = [reservation(f"u{uuid.uuid4().hex[:4]}", n, dt.datetime.now(dt.UTC), 1_000) for n in range(40)]
        for res in made:
            await ledger.reserve(res)
        for res in made:
            await ledger.settle(res.id, res.charge_records(), final(res, "settled", 500))
        assert ledger.flushed == 80 and ledger.flushes <= 2  # the last settlement, with none left in flight, flushed them
        await ledger.close()
        await store.close()

    asyncio.run(main())


def test_expired_counters_leave_memory_and_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from portcullis.adapters.store import sqlite_write_behind

    monkeypatch.setattr(sqlite_write_behind, "_EXPIRE_EVERY", 3)
    path = tmp_path / "state.db"

    async def main() -> None:
        clock = Clock()
        store = SqliteKeyStore.open(path)
        ledger = WriteBehindLedger.open(store.connection, path, clock)
        assert ledger is not None
        first = reservation("t", 0, clock(), 1_000)
        await ledger.reserve(first)
        await ledger.settle(first.id, first.charge_records(), final(first, "settled", 700))
        old_day = f"team:t|cost|d{START:%Y-%m-%d}"
        assert await ledger.counter(old_day) == 700
        clock.now += dt.timedelta(days=3)  # that day's instance, and the month's, are long over
        for n in (1, 2):
            res = reservation("t", n, clock(), 1_000)
            await ledger.reserve(res)
            await ledger.settle(res.id, res.charge_records(), final(res, "settled", 500))
        assert old_day not in {row[0] for row in file_rows(path)["counters"]}  # swept from the file at once ...
        assert await ledger.counter(old_day) == 0  # ... and from memory
        today = f"team:t|cost|d{clock():%Y-%m-%d}"
        assert await ledger.counter(today) == 1_000
        await ledger.close()
        await store.close()

    asyncio.run(main())


def test_a_journal_a_crash_left_is_applied_by_whoever_opens_the_store_next(tmp_path: Path) -> None:
    """Restarted with several workers (writing through), or a CLI command first: the
    crashed gateway's journaled reservations reach the file all the same."""
    path = tmp_path / "state.db"
    script = CRASHING.format(root=str(Path(__file__).resolve().parent.parent), path=str(path))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

    async def main() -> None:
        store = SqliteKeyStore.open(path)
        ledger = open_embedded_ledger(store.connection, path, write_behind=False)
        assert isinstance(ledger, SqliteLedger)
        assert len(await ledger.unresolved(dt.datetime.now(dt.UTC) + dt.timedelta(days=1))) == 5
        await ledger.close()
        await store.close()

    asyncio.run(main())
    assert journal_path(path).stat().st_size == 0


def test_a_torn_last_line_is_left_out_and_damage_before_it_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    good = reservation("t", 1, START, 1_000)
    *row, created = good.open_row()
    entry = {"seq": 1, "op": "reserve", "row": [*row, created.isoformat()], "slides": [], "counters": [], "windows": []}
    journal_path(path).write_bytes(json.dumps(entry).encode() + b'\n{"seq": 2, "op": "res')  # died inside its write
    store = SqliteKeyStore.open(path)
    assert recover(store.connection, journal_path(path)) == 1
    assert [row[0] for row in store.connection.execute("SELECT id FROM reservations")] == [good.id]
    journal_path(path).write_bytes(b'{"seq": 2, "op": "res\n' + json.dumps({**entry, "seq": 3}).encode() + b"\n")
    with pytest.raises(ValueError, match="damaged at line 1"):
        recover(store.connection, journal_path(path))
    asyncio.run(store.close())


def test_a_file_that_cannot_be_written_fails_steps_closed_and_catches_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holds the file's write lock: the flush fails, and reservations are
    refused (never judged on memory the file may not get) until the file takes everything."""
    from portcullis.adapters.store import sqlite_write_behind

    monkeypatch.setattr(sqlite_write_behind, "_EXPIRE_EVERY", 2)
    path = tmp_path / "state.db"

    async def main() -> None:
        clock = Clock()
        store = SqliteKeyStore.open(path)
        store.connection.execute("PRAGMA busy_timeout=0")
        ledger = WriteBehindLedger.open(store.connection, path, clock)
        assert ledger is not None
        first = reservation("t", 0, clock(), 1_000)
        await ledger.reserve(first)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        clock.now += dt.timedelta(days=3)
        await ledger.settle(first.id, first.charge_records(), final(first, "settled", 700))  # its flush fails: waits
        with pytest.raises(StoreUnavailable):
            await ledger.reserve(reservation("t", 1, clock(), 1_000))  # the sweep's turn too, but first the file
        other.execute("ROLLBACK")
        other.close()
        await asyncio.sleep(2 * FOLLOW_SECONDS)
        assert (await ledger.reserve(reservation("t", 2, clock(), 1_000))).blocked is None
        old_day, today = f"team:t|cost|d{START:%Y-%m-%d}", f"team:t|cost|d{clock():%Y-%m-%d}"
        assert await ledger.counter(today) == 1_000
        await ledger.close()
        await store.close()
        values = {key: value for key, value, _, _ in file_rows(path)["counters"]}
        assert values[today] == 1_000 and old_day not in values  # swept once the file could be written
        assert [row[0] for row in file_rows(path)["reservations"]] == [first.id, "req_t_0002"]

    asyncio.run(main())
