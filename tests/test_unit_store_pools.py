"""The shared store's connection pools: sized in config, and waiting (bounded) for a
free connection instead of failing when every one is busy — against real Redis and
PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from portcullis.adapters.config import ConfigError, PostgresPoolConfig, RedisPoolConfig, load_config
from portcullis.adapters.store.connections import postgres_pool, redis_client
from tests.conftest import Services


def holding(client: Redis, services: Services, seconds: float) -> Awaitable[Any]:
    """A command that holds its connection (not the server) for a while: BLPOP on an empty list."""
    return client.blpop([f"{services.redis_prefix}pools:never-pushed"], timeout=seconds)


def test_a_redis_burst_larger_than_the_pool_waits_for_connections(services: Services) -> None:
    async def main() -> None:
        client = redis_client(services.redis_url, RedisPoolConfig(max_connections=4, wait_seconds=10))
        try:
            results = await asyncio.gather(*(holding(client, services, 0.02) for _ in range(200)))  # 50 times the pool
            assert results == [None] * 200  # every one served, none refused for want of a connection
        finally:
            await client.aclose()

    asyncio.run(main())


def test_the_redis_wait_is_bounded(services: Services) -> None:
    async def main() -> None:
        client = redis_client(services.redis_url, RedisPoolConfig(max_connections=1, wait_seconds=0.2))
        try:
            outcomes = await asyncio.gather(holding(client, services, 1.0), client.ping(), return_exceptions=True)
            assert outcomes[0] is None and isinstance(outcomes[1], RedisConnectionError)  # waited 0.2 s for the one connection, not for ever
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_postgres_burst_larger_than_the_pool_waits_for_connections(services: Services) -> None:
    async def main() -> None:
        pool = await postgres_pool(services.database_url, PostgresPoolConfig(min_connections=1, max_connections=3, wait_seconds=10))
        try:

            async def query() -> int:
                async with pool.connection() as connection:
                    cursor = await connection.execute("SELECT 1 FROM pg_sleep(0.01)")
                    row = await cursor.fetchone()
                    assert row is not None
                    return row[0]

            assert await asyncio.gather(*(query() for _ in range(60))) == [1] * 60
        finally:
            await pool.close()

    asyncio.run(main())


def write_config(tmp_path: Path, store: dict) -> Path:
    path = tmp_path / "portcullis.yaml"
    document = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}], "store": store}
    path.write_text(yaml.safe_dump(document))
    return path


def test_pool_sizes_come_from_config_with_documented_defaults(tmp_path: Path) -> None:
    defaults = load_config(write_config(tmp_path, {"kind": "shared"})).store
    assert defaults.redis_pool == RedisPoolConfig(max_connections=64, wait_seconds=10, health_check_seconds=5)
    assert defaults.postgres_pool == PostgresPoolConfig(min_connections=2, max_connections=10, wait_seconds=10)
    store = {"kind": "shared", "redis_pool": {"max_connections": 200, "wait_seconds": 2.5}, "postgres_pool": {"max_connections": 40}}
    configured = load_config(write_config(tmp_path, store)).store
    assert configured.redis_pool == RedisPoolConfig(max_connections=200, wait_seconds=2.5, health_check_seconds=5)
    assert configured.postgres_pool == PostgresPoolConfig(min_connections=2, max_connections=40, wait_seconds=10)


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ({"postgres_pool": {"min_connections": 20, "max_connections": 10}}, "min_connections is larger than max_connections"),
        ({"redis_pool": {"max_connections": 0}}, "max_connections"),
        ({"redis_pool": {"wait_seconds": 0}}, "wait_seconds"),
        ({"redis_pool": {"size": 10}}, "size"),
    ],
)
def test_pool_settings_are_checked(tmp_path: Path, pools: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path, {"kind": "shared", **pools}))
