"""Per-session routing state: the first value written wins, values expire, and the
embedded store's memory stays bounded; the shared one behaves the same in real Redis."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from redis.asyncio import Redis

from portcullis.adapters.store.session_state import MemorySessionState, RedisSessionState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_memory_first_write_wins_and_expires() -> None:
    clock = Clock()
    state = MemorySessionState(clock, max_entries=3)

    async def scenario() -> None:
        assert await state.put_if_absent("s1", "light", 1000) == "light"
        assert await state.put_if_absent("s1", "frontier", 1000) == "light"
        clock.now += 1.5
        assert await state.get("s1") is None
        assert await state.put_if_absent("s1", "frontier", 1000) == "frontier"
        for key in ("a", "b", "c"):
            await state.put(key, "v", 10_000)
        assert await state.get("s1") is None  # the oldest left when the fourth came
        assert await state.get("c") == "v"

    asyncio.run(scenario())


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def test_redis_first_write_wins_across_clients_and_expires(redis_url: str) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"

    async def scenario() -> None:
        one, two = Redis.from_url(redis_url), Redis.from_url(redis_url)
        try:
            a, b = RedisSessionState(one, prefix), RedisSessionState(two, prefix)
            results = await asyncio.gather(a.put_if_absent("s1", "light", 5000), b.put_if_absent("s1", "frontier", 5000))
            assert results[0] == results[1]  # both replicas agree on the first value written
            assert await b.get("s1") == results[0]
            await a.put("s2", "x", 50)
            await asyncio.sleep(0.15)
            assert await b.get("s2") is None
        finally:
            await one.delete(*[key async for key in one.scan_iter(f"{prefix}*")] or ["-"])
            await one.aclose()
            await two.aclose()

    asyncio.run(scenario())
