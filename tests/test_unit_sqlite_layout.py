"""The embedded ledger's page layout (migration 0006): a file written under the earlier
layout keeps every row and every meaning once migrated — open reservations settle, rate
windows slide, the spend journal goes on — and the same requests write fewer WAL pages."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from pathlib import Path

from portcullis.adapters.store import migration_files
from portcullis.adapters.store.ledger import Final, Reservation
from portcullis.adapters.store.sqlite import SqliteLedger, migrate
from portcullis.engine.governance import Bound, CounterLimit, Limits, charges

LAYOUT = "0006_fewer_pages_per_write.sql"
LIMITS = Limits(
    counters=(
        CounterLimit("team:t", "cost", "month", 10**9, None, True, ("cap",), (50,)),
        CounterLimit("team:t", "requests", "minute", 10**6, None, True, ("rate",), ()),
        CounterLimit("team:t", "tokens", "minute", 10**9, None, True, ("tpm",), ()),
    )
)


def reservation(number: int, created: dt.datetime) -> Reservation:
    bound = Bound(tokens=1_000, cost_micro_usd=5_000, estimate="test")
    request_id = f"req_{number:06d}"
    return Reservation(request_id, request_id, "main", {"team": "t", "user": None, "key_id": "k"}, tuple(charges(LIMITS, bound, created)), bound, created)


def final(res: Reservation) -> Final:
    amounts = {c.key: {"cost": 2_000, "requests": 1, "tokens": 300}[c.limit.metric] for c in res.charges}
    return Final("settled", 300, 2_000, amounts, {"input": 200, "output": 100}, {"provider": "p", "model": "m", "region": "r"})


def before_layout(path: Path) -> sqlite3.Connection:
    """A file migrated up to, not including, the new layout: what a gateway of the previous release left."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for version, name, sql in migration_files("sqlite"):
        if name == LAYOUT:
            break
        connection.executescript(f"BEGIN;\n{sql}\nINSERT INTO schema_migrations VALUES ({version}, '{name}', 'then');\nCOMMIT;")
    return connection


def rows(connection: sqlite3.Connection, sql: str) -> list[tuple]:
    return sorted(connection.execute(sql).fetchall())


def test_a_file_of_the_previous_layout_keeps_its_rows_and_meanings(tmp_path: Path) -> None:
    async def main() -> None:
        connection = before_layout(tmp_path / "old.db")
        ledger = SqliteLedger(connection)
        created = dt.datetime.now(dt.UTC)
        made = [reservation(n, created) for n in range(6)]
        for res in made:
            assert (await ledger.reserve(res)).blocked is None
        for res in made[:3]:
            await ledger.settle(res.id, res.charge_records(), final(res))
        tables = ("counters", "window_entries", "reservations", "spend_journal", "threshold_events")
        kept = {table: rows(connection, f"SELECT * FROM {table}") for table in tables}
        unresolved = await ledger.unresolved(created + dt.timedelta(seconds=1))

        assert migrate(connection) == [LAYOUT, "0007_ledger_journal.sql"]  # and the next migration, which adds a table
        assert {table: rows(connection, f"SELECT * FROM {table}") for table in tables} == kept
        assert await ledger.unresolved(created + dt.timedelta(seconds=1)) == unresolved
        assert [u.id for u in unresolved] == [res.id for res in made[3:]]
        # The partial index is what reconciliation's query reads.
        plan = " ".join(
            str(step)
            for step in connection.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM reservations WHERE state IN ('open', 'pending') AND (state = 'pending' OR created_at < ?)", ("x",)
            )
        )
        assert "reservations_unresolved" in plan

        # A reservation made before the migration settles after it: its window entries move.
        for res in made[3:]:
            assert (await ledger.settle(res.id, res.charge_records(), final(res))).state == "settled"
        assert (await ledger.settle(made[3].id, made[3].charge_records(), final(made[3]))).replayed
        values = dict(connection.execute("SELECT key, value FROM counters"))
        by_metric = {charge.limit.metric: charge.key for charge in made[0].charges}
        assert values[by_metric["cost"]] == 6 * 2_000
        assert values[by_metric["requests"]] == 6
        assert values[by_metric["tokens"]] == 6 * 300
        assert rows(connection, "SELECT DISTINCT amount FROM window_entries WHERE counter LIKE '%tokens%'") == [(300,)]
        # The journal goes on: one entry per step, ids growing past the ones it had.
        journal = connection.execute("SELECT id, reservation_id, entry FROM spend_journal ORDER BY id").fetchall()
        assert [entry for _, _, entry in journal].count("settled") == 6
        assert [entry for _, _, entry in journal].count("reserve") == 6
        assert [i for i, _, _ in journal] == sorted({i for i, _, _ in journal})

        # A window slides under the new key: entries older than the window leave, and their amounts with them.
        later = created + dt.timedelta(seconds=61)
        assert (await ledger.reserve(reservation(99, later))).blocked is None
        values = dict(connection.execute("SELECT key, value FROM counters"))
        assert values[by_metric["requests"]] == 1
        assert values[by_metric["cost"]] == 6 * 2_000 + 5_000  # a calendar counter does not slide
        connection.close()

    asyncio.run(main())


def wal_pages(connection: sqlite3.Connection, path: Path, requests: int) -> int:
    """WAL frames the ledger writes for ``requests`` reserve-and-settle steps, checkpoints held off."""

    async def steps() -> None:
        ledger = SqliteLedger(connection)
        created = dt.datetime.now(dt.UTC)
        for n in range(requests):
            res = reservation(n, created)
            await ledger.reserve(res)
            await ledger.settle(res.id, res.charge_records(), final(res))

    connection.execute("PRAGMA wal_autocheckpoint=0")
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    asyncio.run(steps())
    return (path.with_name(path.name + "-wal").stat().st_size - 32) // (4096 + 24)


def test_the_same_requests_write_fewer_pages_than_under_the_previous_layout(tmp_path: Path) -> None:
    old_path, new_path = tmp_path / "old.db", tmp_path / "new.db"
    old = before_layout(old_path)
    new = before_layout(new_path)
    migrate(new)
    old_pages, new_pages = wal_pages(old, old_path, 300), wal_pages(new, new_path, 300)
    # Measured when written: 18 pages per request before, 12.6 after (three counters).
    assert new_pages < 0.85 * old_pages, (old_pages, new_pages)
