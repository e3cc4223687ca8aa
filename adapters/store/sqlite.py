"""Embedded store: one SQLite file, zero services; the gateway's processes and the CLI
share it (WAL mode: readers never wait, writers take turns)."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

from portcullis.adapters.store import KeyRecord, SealedSecret, migration_files
from portcullis.adapters.store.sqlite_checkpoints import BACKSTOP_PAGES, Checkpointer
from portcullis.adapters.store.sqlite_ledger import SqliteLedger

__all__ = ["SqliteKeyStore", "SqliteLedger", "migrate"]

# What a commit survives (``store.durability``): ``process`` a crash of the gateway (the
# WAL is in the OS's hands at commit; fsync'd at checkpoints), ``fsync`` a crash of the
# machine (the commit waits for the WAL to reach the disk).
SYNCHRONOUS = {"process": "NORMAL", "fsync": "FULL"}
_WAL_LIMIT_BYTES = 64 * 1024 * 1024  # a WAL file that grew past this shrinks back when it restarts


class SqliteKeyStore:
    def __init__(self, connection: sqlite3.Connection, applied_migrations: list[str], checkpointer: Checkpointer | None = None) -> None:
        self._db = connection
        self.connection = connection  # shared with the ledger
        self.applied_migrations = applied_migrations
        self._checkpointer = checkpointer

    @classmethod
    def open(cls, path: Path, durability: str = "process") -> SqliteKeyStore:
        synchronous = SYNCHRONOUS[durability]
        path.parent.mkdir(parents=True, exist_ok=True)
        # Lookups take microseconds, so they run on the event loop instead of paying
        # for a thread hop; busy_timeout covers another process writing at the same moment.
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(f"PRAGMA synchronous={synchronous}")
        connection.execute("PRAGMA busy_timeout=5000")
        # A statement's scratch tables (IN lists, RETURNING) in memory, not in temporary files.
        connection.execute("PRAGMA temp_store=MEMORY")
        # Checkpoints run on a thread of their own (sqlite_checkpoints); this one only past the backstop.
        connection.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
        connection.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
        applied = migrate(connection)
        checkpointer = Checkpointer(path, synchronous)
        checkpointer.start()
        return cls(connection, applied, checkpointer)

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
        revoked = 0
        for sql in _REVOKE:
            revoked += self._db.execute(sql, (when.isoformat(), key_id)).rowcount
        return revoked == 1

    async def list_keys(self) -> list[KeyRecord]:
        rows = self._db.execute(
            "SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys"
            " UNION ALL SELECT access_key_id, team, user_id, name, created_at, revoked_at FROM aws_credentials ORDER BY created_at"
        ).fetchall()
        return [_record(row) for row in rows]

    async def create_aws_credential(self, record: KeyRecord, sealed: SealedSecret) -> None:
        self._db.execute(
            "INSERT INTO aws_credentials (access_key_id, sealed_secret, seal_key_id, team, user_id, name, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.key_id, sealed.blob, sealed.seal_key_id, record.team, record.user, record.name, record.created_at.isoformat()),
        )

    async def find_aws_credential(self, access_key_id: str) -> tuple[KeyRecord, SealedSecret] | None:
        row = self._db.execute(f"{_AWS_SELECT} WHERE access_key_id = ?", (access_key_id,)).fetchone()
        return _aws_record(row) if row else None

    async def aws_credentials(self) -> list[tuple[KeyRecord, SealedSecret]]:
        return [_aws_record(row) for row in self._db.execute(f"{_AWS_SELECT} ORDER BY created_at").fetchall()]

    async def replace_sealed(self, access_key_id: str, old: SealedSecret, new: SealedSecret) -> bool:
        cursor = self._db.execute(
            "UPDATE aws_credentials SET sealed_secret = ?, seal_key_id = ? WHERE access_key_id = ? AND sealed_secret = ?",
            (new.blob, new.seal_key_id, access_key_id, old.blob),
        )
        return cursor.rowcount == 1

    async def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self._db.close()


_REVOKE = (
    "UPDATE virtual_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
    "UPDATE aws_credentials SET revoked_at = ? WHERE access_key_id = ? AND revoked_at IS NULL",
)
_AWS_SELECT = "SELECT access_key_id, team, user_id, name, created_at, revoked_at, seal_key_id, sealed_secret FROM aws_credentials"


def _aws_record(row: tuple) -> tuple[KeyRecord, SealedSecret]:
    return _record(row[:6]), SealedSecret(row[6], bytes(row[7]))


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
        applied_at = dt.datetime.now(dt.UTC).isoformat()
        try:  # executescript: trigger bodies hold semicolons a plain split would break
            connection.executescript(f"BEGIN IMMEDIATE;\n{sql}\nINSERT INTO schema_migrations VALUES ({version}, '{name}', '{applied_at}');\nCOMMIT;")
        except Exception:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied
