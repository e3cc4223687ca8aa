"""The shared store's connection pools: one for Redis and one for PostgreSQL per
process, sized in config. Every client of the shared store (key store, ledger,
auth-failure counters, provider-key capacity, PII vault) borrows from them.

Both pools *wait* (bounded) for a free connection instead of failing at once: a burst
larger than the pool queues for a few milliseconds rather than turning into 503s.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from portcullis.adapters.config import PostgresPoolConfig, RedisPoolConfig
from portcullis.adapters.store import StoreUnavailable

_SOCKET_SECONDS = 2  # one Redis command or connect; the pool wait is configured separately


def redis_client(url: str, config: RedisPoolConfig) -> Redis:
    """A client over a blocking pool. After a Redis restart the pooled sockets are dead
    until used: an idle one is PINGed before use, and a command that meets a broken
    connection is sent once more on a fresh one. Only connection errors are retried, not
    timeouts: a timed-out script may have run, and running it twice would charge twice."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=config.max_connections,
        timeout=config.wait_seconds,
        socket_timeout=_SOCKET_SECONDS,
        socket_connect_timeout=_SOCKET_SECONDS,
        health_check_interval=config.health_check_seconds,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return Redis.from_pool(pool)


# What a commit waits for, by ``store.durability``. ``process``: the database server has
# the commit in memory (it survives the gateway's crash, not the database server's or
# its host's: the last ~0.6 s of commits, 3 × wal_writer_delay, can be lost then), so a
# commit costs a round trip, not a disk flush. ``fsync``: the commit is on the server's
# disk. Set once per pooled connection; writes that must outlive a database crash
# whatever the setting (keys, revocations, migrations) ask for ``on`` in their own
# transaction.
SYNCHRONOUS_COMMIT = {"process": "off", "fsync": "on"}


async def postgres_pool(url: str, config: PostgresPoolConfig, durability: str = "process") -> AsyncConnectionPool:
    """An open pool whose ``connection()`` waits up to ``wait_seconds`` for a free one,
    and whose connections commit at ``durability``."""
    level = SYNCHRONOUS_COMMIT[durability]

    async def configure(connection: AsyncConnection) -> None:
        await connection.execute(f"SET synchronous_commit = {level}")  # autocommit: for the session

    pool = AsyncConnectionPool(
        url,
        min_size=config.min_connections,
        max_size=config.max_connections,
        timeout=config.wait_seconds,
        open=False,
        kwargs={"autocommit": True},
        configure=configure,
    )
    try:
        await pool.open(wait=True, timeout=10)
    except Exception as error:
        await pool.close()
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {type(error).__name__}") from None
    return pool
