"""State behind the gateway, chosen by ``store.kind``: ``embedded`` (one SQLite file and
in-process counters, zero services) or ``shared`` (PostgreSQL for durable records,
Redis for hot counters shared by every replica). Both offer the same interfaces."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from portcullis.adapters.config import StoreConfig

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from portcullis.adapters.providers.keys import Capacity
    from portcullis.adapters.store.breakers import BreakerBoard
    from portcullis.adapters.store.ledger import Ledger
    from portcullis.adapters.store.replay import ReplayGuard
    from portcullis.adapters.store.session_state import SessionState

MIGRATIONS = Path(__file__).parent / "migrations"


class StoreUnavailable(Exception):
    """The store cannot be reached; callers fail closed."""


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    team: str
    user: str | None
    name: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@dataclass(frozen=True)
class SealedSecret:
    """An AWS credential's secret as stored: nonce and AES-GCM ciphertext, and the id of
    the seal key that sealed it."""

    seal_key_id: str
    blob: bytes


class KeyStore(Protocol):
    async def find_by_hash(self, key_hash: str) -> KeyRecord | None: ...
    async def create_key(self, record: KeyRecord, key_hash: str) -> None: ...
    async def revoke_key(self, key_id: str, when: dt.datetime) -> bool:
        """Revoke a virtual key or an AWS credential (``record.key_id`` is its access key id)."""
        ...

    async def list_keys(self) -> list[KeyRecord]:
        """Virtual keys and AWS credentials, oldest first."""
        ...

    async def create_aws_credential(self, record: KeyRecord, sealed: SealedSecret) -> None: ...
    async def find_aws_credential(self, access_key_id: str) -> tuple[KeyRecord, SealedSecret] | None: ...
    async def aws_credentials(self) -> list[tuple[KeyRecord, SealedSecret]]: ...
    async def replace_sealed(self, access_key_id: str, old: SealedSecret, new: SealedSecret) -> bool:
        """Swap a secret's seal, unless it changed meanwhile (another reseal)."""
        ...

    async def close(self) -> None: ...


class FailureCounter(Protocol):
    """Counts failed authentications per client within a fixed window."""

    async def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again, or None when it is not blocked."""
        ...

    async def record_failure(self, client: str) -> None: ...
    async def close(self) -> None: ...


@dataclass
class Store:
    keys: KeyStore
    auth_failures: FailureCounter
    ledger: Ledger
    capacity: Capacity  # provider keys' per-minute use and cooldowns
    redis: Redis | None = None  # the shared store's Redis, for state that lives there (the PII vault)
    replays: ReplayGuard = field(default_factory=lambda: _memory_replays())  # SigV4 signatures already seen
    sessions: SessionState = field(default_factory=lambda: _memory_sessions())  # per-session routing state (pinned tiers)
    breakers: BreakerBoard = field(default_factory=lambda: _memory_breakers())  # targets' circuit breakers

    async def close(self) -> None:
        await self.ledger.close()  # first: an embedded ledger may still write to the key store's file
        await self.keys.close()
        await self.auth_failures.close()
        if self.redis is not None:
            await self.redis.aclose()  # and its pool, which every Redis client here borrowed from


async def open_store(config: StoreConfig, max_failures: int, window: int, migrate: bool = False, sole_gateway: bool = False) -> Store:
    """Open the configured store. Embedded stores migrate themselves; a shared schema is
    migrated explicitly (``portcullis db migrate``) unless ``migrate`` is set.
    ``sole_gateway``: this process is the only gateway process on the store (``workers:
    1``), so an embedded ledger may keep its counters in memory and write its file
    behind the requests (``sqlite_write_behind``; ``durability: process`` only — at
    ``fsync`` every step waits for the disk either way, and writes through)."""
    from portcullis.adapters.store.capacity import MemoryCapacity, RedisCapacity
    from portcullis.adapters.store.limiter import MemoryFailureCounter, RedisFailureCounter

    if config.kind == "embedded":
        from portcullis.adapters.store.sqlite import SqliteKeyStore
        from portcullis.adapters.store.sqlite_write_behind import open_embedded_ledger

        sqlite = SqliteKeyStore.open(config.path, config.durability)
        try:
            ledger = open_embedded_ledger(sqlite.connection, config.path, write_behind=sole_gateway and config.durability == "process")
        except BaseException:
            await sqlite.close()
            raise
        return Store(sqlite, MemoryFailureCounter(max_failures, window), ledger, MemoryCapacity())
    from portcullis.adapters.store.connections import redis_client
    from portcullis.adapters.store.postgres import PostgresKeyStore
    from portcullis.adapters.store.shared import SharedLedger

    # One PostgreSQL pool and one Redis pool for the whole process: every client below shares them.
    database_url, redis_url = config.url(config.database_url_env), config.url(config.redis_url_env)
    keys = await PostgresKeyStore.open(database_url, migrate=migrate, pool=config.postgres_pool, durability=config.durability)
    redis = redis_client(redis_url, config.redis_pool)
    failures = RedisFailureCounter(redis, max_failures, window, config.redis_prefix)
    ledger = SharedLedger(redis, keys.pool, config.redis_prefix)
    from portcullis.adapters.store.breakers import RedisBreakerBoard
    from portcullis.adapters.store.replay import RedisReplayGuard
    from portcullis.adapters.store.session_state import RedisSessionState

    return Store(
        keys,
        failures,
        ledger,
        RedisCapacity(redis, config.redis_prefix),
        redis,
        RedisReplayGuard(redis, config.redis_prefix),
        RedisSessionState(redis, config.redis_prefix),
        RedisBreakerBoard(redis, config.redis_prefix),
    )


def _memory_replays() -> ReplayGuard:
    from portcullis.adapters.store.replay import MemoryReplayGuard  # imports this module: deferred

    return MemoryReplayGuard()


def _memory_sessions() -> SessionState:
    from portcullis.adapters.store.session_state import MemorySessionState  # imports this module: deferred

    return MemorySessionState()


def _memory_breakers() -> BreakerBoard:
    from portcullis.adapters.store.breakers import MemoryBreakerBoard  # imports this module: deferred

    return MemoryBreakerBoard()


def migration_files(dialect: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration of a dialect, in order."""
    found = []
    for path in sorted((MIGRATIONS / dialect).glob("*.sql")):
        found.append((int(path.name.split("_", 1)[0]), path.name, path.read_text()))
    return found
