"""Embedded store: one SQLite file, for a single gateway process and zero services."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

from portcullis.adapters.store import KeyRecord, migration_files


class SqliteKeyStore:
    def __init__(self, connection: sqlite3.Connection, applied_migrations: list[str]) -> None:
        self._db = connection
        self.applied_migrations = applied_migrations

    @classmethod
    def open(cls, path: Path) -> SqliteKeyStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Lookups take microseconds, so they run on the event loop instead of paying
        # for a thread hop; busy_timeout covers the CLI writing at the same moment.
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA busy_timeout=5000")
        return cls(connection, migrate(connection))

    async def find_by_hash(self, key_hash: str) -> KeyRecord | None:
        row = self._db.execute(
            "SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys WHERE key_hash = ?",
            (key_hash,),
        ).fetchone()
        return _record(row) if row else None

    async def create_key(self, record: KeyRecord, key_hash: str) -> None:
        self._db.execute(
            "INSERT INTO virtual_keys (key_id, key_hash, team, user_id, name, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (record.key_id, key_hash, record.team, record.user, record.name, record.created_at.isoformat()),
        )

    async def revoke_key(self, key_id: str, when: dt.datetime) -> bool:
        cursor = self._db.execute("UPDATE virtual_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (when.isoformat(), key_id))
        return cursor.rowcount == 1

    async def list_keys(self) -> list[KeyRecord]:
        rows = self._db.execute("SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys ORDER BY created_at").fetchall()
        return [_record(row) for row in rows]

    async def close(self) -> None:
        self._db.close()


def _record(row: tuple) -> KeyRecord:
    key_id, team, user, name, created, revoked = row
    return KeyRecord(key_id, team, user, name, dt.datetime.fromisoformat(created), dt.datetime.fromisoformat(revoked) if revoked else None)


def migrate(connection: sqlite3.Connection) -> list[str]:
    """Apply pending migrations, each in its own transaction; returns what was applied."""
    connection.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    done = {row[0] for row in connection.execute("SELECT version FROM schema_migrations")}
    applied = []
    for version, name, sql in migration_files("sqlite"):
        if version in done:
            continue
        connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, sql.split(";")):
                connection.execute(statement)
            connection.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, dt.datetime.now(dt.UTC).isoformat()))
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied
