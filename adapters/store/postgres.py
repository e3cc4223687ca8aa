"""Shared store, durable side: PostgreSQL through psycopg 3 and a connection pool."""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg_pool import AsyncConnectionPool

from portcullis.adapters.config import PostgresPoolConfig
from portcullis.adapters.store import KeyRecord, SealedSecret, StoreUnavailable, migration_files
from portcullis.adapters.store.connections import postgres_pool

_MIGRATION_LOCK = 7_243_091_613  # pg_advisory_lock id: one migrator at a time across replicas


class PostgresKeyStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self.pool = pool  # shared with the ledger
        self.applied_migrations: list[str] = []

    @classmethod
    async def open(cls, url: str, migrate: bool = False, pool: PostgresPoolConfig | None = None, durability: str = "process") -> PostgresKeyStore:
        """``durability`` is the ledger's (``store.durability``): the pool's connections
        commit at it; this store's own writes always wait for the disk."""
        store = cls(await postgres_pool(url, pool or PostgresPoolConfig(), durability))
        if migrate:
            store.applied_migrations = await store.migrate()
        else:
            await store._require_schema()
        return store

    async def migrate(self) -> list[str]:
        async with self._pool.connection() as connection:
            await connection.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
            try:
                await connection.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations"
                    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                cursor = await connection.execute("SELECT version FROM schema_migrations")
                done = {row[0] for row in await cursor.fetchall()}
                applied = []
                for version, name, sql in migration_files("postgres"):
                    if version in done:
                        continue
                    async with connection.transaction():
                        await connection.execute(_DURABLE)
                        await connection.execute(sql)
                        await connection.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                    applied.append(name)
                return applied
            finally:
                await connection.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

    async def _require_schema(self) -> None:
        latest = migration_files("postgres")[-1][0]
        try:
            async with self._pool.connection() as connection:
                cursor = await connection.execute("SELECT coalesce(max(version), 0) FROM schema_migrations")
                row = await cursor.fetchone()
        except psycopg.errors.UndefinedTable:
            row = (0,)
        if row is None or row[0] < latest:
            raise StoreUnavailable("the PostgreSQL schema is not up to date: run `portcullis db migrate`")

    async def find_by_hash(self, key_hash: str) -> KeyRecord | None:
        row = await self._one("SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys WHERE key_hash = %s", (key_hash,), write=False)
        return KeyRecord(*row) if row else None

    async def create_key(self, record: KeyRecord, key_hash: str) -> None:
        await self._one(
            "INSERT INTO virtual_keys (key_id, key_hash, team, user_id, name, created_at) VALUES (%s, %s, %s, %s, %s, %s) RETURNING key_id",
            (record.key_id, key_hash, record.team, record.user, record.name, record.created_at),
        )

    async def revoke_key(self, key_id: str, when: dt.datetime) -> bool:
        row = await self._one(
            "WITH keys AS (UPDATE virtual_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL RETURNING key_id),"
            " credentials AS (UPDATE aws_credentials SET revoked_at = %s WHERE access_key_id = %s AND revoked_at IS NULL RETURNING access_key_id)"
            " SELECT (SELECT count(*) FROM keys) + (SELECT count(*) FROM credentials)",
            (when, key_id, when, key_id),
        )
        return row is not None and row[0] == 1

    async def list_keys(self) -> list[KeyRecord]:
        rows = await self._all(
            "SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys"
            " UNION ALL SELECT access_key_id, team, user_id, name, created_at, revoked_at FROM aws_credentials ORDER BY created_at",
            (),
        )
        return [KeyRecord(*row) for row in rows]

    async def create_aws_credential(self, record: KeyRecord, sealed: SealedSecret) -> None:
        await self._one(
            "INSERT INTO aws_credentials (access_key_id, sealed_secret, seal_key_id, team, user_id, name, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING access_key_id",
            (record.key_id, sealed.blob, sealed.seal_key_id, record.team, record.user, record.name, record.created_at),
        )

    async def find_aws_credential(self, access_key_id: str) -> tuple[KeyRecord, SealedSecret] | None:
        row = await self._one(f"{_AWS_SELECT} WHERE access_key_id = %s", (access_key_id,), write=False)
        return _aws_record(row) if row else None

    async def aws_credentials(self) -> list[tuple[KeyRecord, SealedSecret]]:
        return [_aws_record(row) for row in await self._all(f"{_AWS_SELECT} ORDER BY created_at", ())]

    async def replace_sealed(self, access_key_id: str, old: SealedSecret, new: SealedSecret) -> bool:
        row = await self._one(
            "UPDATE aws_credentials SET sealed_secret = %s, seal_key_id = %s WHERE access_key_id = %s AND sealed_secret = %s RETURNING access_key_id",
            (new.blob, new.seal_key_id, access_key_id, old.blob),
        )
        return row is not None

    async def close(self) -> None:
        await self._pool.close()

    async def _all(self, sql: str, params: tuple) -> list[tuple]:
        try:
            async with self._pool.connection() as connection:
                cursor = await connection.execute(sql, params)
                return await cursor.fetchall()
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None

    async def _one(self, sql: str, params: tuple, write: bool = True) -> tuple | None:
        """One statement; a write in a transaction that waits for the disk whatever the
        pool's ``synchronous_commit`` (a revoked key must stay revoked after a crash)."""
        try:
            async with self._pool.connection() as connection:
                if not write:
                    cursor = await connection.execute(sql, params)
                    return await cursor.fetchone()
                async with connection.transaction():
                    await connection.execute(_DURABLE)
                    cursor = await connection.execute(sql, params)
                    return await cursor.fetchone()
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None


_DURABLE = "SET LOCAL synchronous_commit = on"

_AWS_SELECT = "SELECT access_key_id, team, user_id, name, created_at, revoked_at, seal_key_id, sealed_secret FROM aws_credentials"


def _aws_record(row: tuple) -> tuple[KeyRecord, SealedSecret]:
    return KeyRecord(*row[:6]), SealedSecret(row[6], bytes(row[7]))
