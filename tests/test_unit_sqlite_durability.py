"""The embedded store's durability level and WAL checkpoints, read back from a real
SQLite file: ``store.durability`` sets what a commit waits for, and the WAL is copied
back into the database file by the checkpoint thread, not by a committing request."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from portcullis.adapters.config import StoreConfig
from portcullis.adapters.store import open_store
from portcullis.adapters.store.sqlite import SqliteKeyStore, SqliteLedger
from portcullis.adapters.store.sqlite_checkpoints import BACKSTOP_PAGES
from tests.conftest import wait_for
from tests.test_unit_sqlite_group_commit import reservation

SYNCHRONOUS = {1: "NORMAL", 2: "FULL"}


@pytest.mark.parametrize(("durability", "expected"), [("process", "NORMAL"), ("fsync", "FULL")])
def test_the_durability_level_sets_what_a_commit_waits_for(tmp_path: Path, durability: str, expected: str) -> None:
    async def main() -> None:
        store = await open_store(StoreConfig(kind="embedded", durability=durability, path=tmp_path / "state.db"), 5, 60)
        try:
            connection = store.keys.connection
            assert SYNCHRONOUS[connection.execute("PRAGMA synchronous").fetchone()[0]] == expected
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES
            res = reservation("durable", 1_000, 10_000)
            assert (await store.ledger.reserve(res)).blocked is None  # and the ledger writes through it
        finally:
            await store.close()
        with sqlite3.connect(tmp_path / "state.db") as reader:
            assert reader.execute("SELECT state FROM reservations WHERE id = ?", (res.id,)).fetchall() == [("open",)]

    asyncio.run(main())


def test_the_checkpoint_thread_copies_the_wal_into_the_database(tmp_path: Path) -> None:
    """The committing connection never reaches its backstop here, so the database file
    grows only if the thread checkpointed."""
    path = tmp_path / "state.db"

    async def main() -> None:
        store = SqliteKeyStore.open(path)
        ledger = SqliteLedger(store.connection)
        before = path.stat().st_size
        for _ in range(200):
            await ledger.reserve(reservation("checkpoints", 1, 1_000_000))
        assert wait_for(lambda: path.stat().st_size > before and store._checkpointer.checkpoints > 0, timeout=5)
        await store.close()
        assert not store._checkpointer._thread.is_alive()  # stopped with the store

    asyncio.run(main())
