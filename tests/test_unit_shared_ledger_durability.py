"""The shared ledger's failure paths and durability, against real Redis and PostgreSQL:
a refused, unjudged or cancelled reservation leaves no row, an admission PostgreSQL
could not record is taken back from the counters, and ``store.durability`` sets what
the ledger's commits wait for while key writes always wait for the disk."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from portcullis.adapters.config import PostgresPoolConfig, StoreConfig
from portcullis.adapters.store import StoreUnavailable, open_store
from portcullis.adapters.store.postgres import PostgresKeyStore
from portcullis.adapters.store.shared import SharedLedger
from tests.test_unit_ledger import reservation

SMALL_POOL = PostgresPoolConfig(min_connections=1, max_connections=1, wait_seconds=0.3)


@asynccontextmanager
async def shared_ledger(services: Any, pool: PostgresPoolConfig | None = None, redis_url: str | None = None) -> AsyncIterator[SharedLedger]:
    keys = await PostgresKeyStore.open(services.database_url, pool=pool)
    client = aioredis.Redis.from_url(redis_url or services.redis_url)
    try:
        yield SharedLedger(client, keys.pool, f"{services.redis_prefix}durability-{uuid.uuid4().hex[:6]}:")
    finally:
        await client.aclose()
        await keys.close()


def rows(services: Any, reservation_id: str) -> tuple[list[tuple], list[tuple]]:
    """The reservation's row (state) and its journal entries, read on a connection of their own."""
    with psycopg.connect(services.database_url) as connection:
        found = connection.execute("SELECT state FROM reservations WHERE id = %s", (reservation_id,)).fetchall()
        journal = connection.execute("SELECT entry, cost_delta FROM spend_journal WHERE reservation_id = %s ORDER BY id", (reservation_id,)).fetchall()
    return found, journal


def team() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def test_a_refused_reservation_leaves_no_row(services) -> None:
    name = team()

    async def main() -> None:
        async with shared_ledger(services) as ledger:
            big = reservation(name, bound=90_000)
            assert (await ledger.reserve(big)).blocked is None
            refused = reservation(name, bound=20_000)
            verdict = await ledger.reserve(refused)
            assert verdict.blocked is not None and verdict.blocked.limit.metric == "cost"
            assert await ledger.counter(big.charges[0].key) == 90_000 and await ledger.counter(big.charges[1].key) == 1
            assert rows(services, refused.id) == ([], [])
            assert rows(services, big.id)[0] == [("open",)]

    asyncio.run(main())


def test_counters_that_cannot_be_reached_leave_no_row_unless_failing_open(services) -> None:
    """Redis refuses the connection: closed, the reservation is refused and leaves no
    row; failing open, it is admitted unmetered and its row is kept."""

    async def main() -> None:
        async with shared_ledger(services, redis_url="redis://127.0.0.1:1/0") as ledger:
            closed = reservation(team())
            with pytest.raises(StoreUnavailable):
                await ledger.reserve(closed)
            assert rows(services, closed.id) == ([], [])
            open_ = reservation(team())
            assert (await ledger.reserve(open_, fail_open=True)).unmetered
            assert rows(services, open_.id)[0] == [("open",)]

    asyncio.run(main())


def test_an_admission_postgresql_did_not_record_is_taken_back(services) -> None:
    """The pool's only connection is busy past the wait: the insert fails after Redis
    admitted the reservation, so the counters give it back and no row is left."""
    name = team()

    async def main() -> None:
        async with shared_ledger(services, pool=SMALL_POOL) as ledger:
            first = reservation(name, bound=30_000)
            assert (await ledger.reserve(first)).blocked is None  # the counters now exist in Redis
            second = reservation(name, bound=20_000)
            async with ledger._pool.connection():  # held: the second insert times out
                with pytest.raises(StoreUnavailable):
                    await ledger.reserve(second)
            assert await ledger.counter(first.charges[0].key) == 30_000
            assert await ledger.counter(first.charges[1].key) == 1
            assert rows(services, second.id) == ([], [])
            third = reservation(name, bound=20_000)  # and the request retried later is admitted once
            assert (await ledger.reserve(third)).blocked is None
            assert await ledger.counter(first.charges[0].key) == 50_000

    asyncio.run(main())


def test_a_reservation_cancelled_mid_admission_leaves_no_row(services) -> None:
    """The client went away while the script was in flight: nothing is recorded (a
    counter may keep its bound until its period ends: over, never under)."""

    async def main() -> None:
        async with shared_ledger(services) as ledger:
            started = asyncio.Event()

            async def never_answers(**call: Any) -> Any:
                started.set()
                await asyncio.Event().wait()

            ledger._reserve_script = never_answers
            res = reservation(team())
            task = asyncio.create_task(ledger.reserve(res))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert rows(services, res.id) == ([], [])

    asyncio.run(main())


async def synchronous_commit(pool: Any) -> str:
    async with pool.connection() as connection:
        cursor = await connection.execute("SHOW synchronous_commit")
        row = await cursor.fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize(("durability", "expected"), [("process", "off"), ("fsync", "on")])
def test_the_ledgers_commits_wait_for_what_store_durability_asks(
    services, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, durability: str, expected: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", services.database_url)
    monkeypatch.setenv("REDIS_URL", services.redis_url)

    async def main() -> None:
        config = StoreConfig(kind="shared", durability=durability, redis_prefix=f"{services.redis_prefix}durability:", postgres_pool=SMALL_POOL)
        store = await open_store(config, 5, 60)
        try:
            ledger = store.ledger
            assert isinstance(ledger, SharedLedger)
            assert await synchronous_commit(ledger._pool) == expected  # the one connection every ledger statement runs on
            res = reservation(team())
            assert (await ledger.reserve(res)).blocked is None
            assert rows(services, res.id)[0] == [("open",)]
        finally:
            await store.close()

    asyncio.run(main())


def test_key_writes_wait_for_the_disk_whatever_the_ledgers_durability(services) -> None:
    """A revocation must outlive a database crash: key writes commit with
    ``synchronous_commit = on`` in their own transaction (a trigger records what the
    write's transaction had), and leave the pooled connection at the ledger's setting."""
    from portcullis.adapters.store import KeyRecord

    async def main(url: str) -> None:
        keys = await PostgresKeyStore.open(url, migrate=True, pool=SMALL_POOL, durability="process")
        try:
            async with keys.pool.connection() as connection:
                await connection.execute("CREATE TABLE seen (setting TEXT)")
                await connection.execute(
                    "CREATE FUNCTION record_setting() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN INSERT INTO seen VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$"
                )
                await connection.execute("CREATE TRIGGER record_setting AFTER INSERT OR UPDATE ON virtual_keys FOR EACH ROW EXECUTE FUNCTION record_setting()")
            record = KeyRecord(f"key_{uuid.uuid4().hex[:8]}", "t", None, None, dt.datetime.now(dt.UTC), None)
            await keys.create_key(record, uuid.uuid4().hex)
            assert await keys.revoke_key(record.key_id, dt.datetime.now(dt.UTC))
            async with keys.pool.connection() as connection:
                seen = await (await connection.execute("SELECT setting FROM seen")).fetchall()
            assert seen == [("on",), ("on",)]
            assert await synchronous_commit(keys.pool) == "off"  # SET LOCAL ended with the write's transaction
        finally:
            await keys.close()

    with services.scratch_database() as url:
        asyncio.run(main(url))
