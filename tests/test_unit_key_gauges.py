"""Provider key gauges: each key's configured limits, and its cool-down after a 429 as
the store holds it — this process's own (embedded), another replica's (Redis), another
worker's (the supervisor's host) — cleared when the cool-down ends, with or without a
refresh, and kept ending on time while the store cannot be read."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from portcullis.adapters.config import KeyConfig, ProviderConfig
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.capacity import KeyAllowance, MemoryCapacity, RedisCapacity, Taken
from portcullis.adapters.store.hosted import ALLOWED, AnnouncedCapacity, SharedCapacity
from portcullis.adapters.store.state_host import Announcer, StateClient, StateHost
from portcullis.adapters.telemetry import prometheus
from portcullis.adapters.telemetry.key_gauges import KeyGauges
from portcullis.adapters.telemetry.registry import Registry
from tests.metrics_helpers import samples, value

SECRET = "sk-live-0123456789abcdefSECRET"
COOLING, LIMIT, STARTED = "portcullis_provider_key_cooling_down", "portcullis_provider_key_limit", "portcullis_provider_key_cooldowns_total"


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> ProviderConfig:
    monkeypatch.setenv("UPSTREAM_PRIMARY_KEY", SECRET)
    keys = (KeyConfig("primary", api_key_env="UPSTREAM_PRIMARY_KEY", rpm=60, tpm=100_000), KeyConfig("spare", tpm=5_000))
    return ProviderConfig("openai-main", "openai", "http://127.0.0.1:1/v1", keys=keys, cooldown_seconds=10)


def gauges_for(pools: dict[str, KeyPool], capacity: Any, clock: Any = None) -> tuple[Registry, KeyGauges]:
    registry = Registry()
    return registry, KeyGauges(registry, pools, capacity, **({"clock": clock} if clock else {}))


def text_of(registry: Registry) -> str:
    return prometheus.render(registry.snapshot())


def cooling(text: str) -> dict[str, float]:
    return {labels["key"]: v for name, labels, v in samples(text) if name == COOLING}


def test_each_keys_limits_come_from_the_configuration_and_no_secret_does(provider: ProviderConfig) -> None:
    pool = KeyPool(provider, MemoryCapacity())
    registry, _ = gauges_for({"openai-main": pool}, MemoryCapacity())
    text = text_of(registry)
    limits = {(labels["portcullis_provider"], labels["key"], labels["kind"]): v for name, labels, v in samples(text) if name == LIMIT}
    assert limits == {("openai-main", "primary", "rpm"): 60, ("openai-main", "primary", "tpm"): 100_000, ("openai-main", "spare", "tpm"): 5_000}
    assert cooling(text) == {"primary": 0, "spare": 0}  # every configured key, 0 when healthy
    assert SECRET not in text and "UPSTREAM_PRIMARY_KEY" not in text


def test_a_429_cool_down_shows_at_once_then_clears_when_it_ends(provider: ProviderConfig) -> None:
    clock = [1_000_000.0]
    capacity = MemoryCapacity(clock=lambda: clock[0])
    pool = KeyPool(provider, capacity)
    registry, gauges = gauges_for({"openai-main": pool}, capacity, clock=lambda: clock[0])

    async def main() -> None:
        await pool.cool_down(pool.first, 30)  # a 429 with retry-after: 30
        assert cooling(text_of(registry)) == {"primary": 1, "spare": 0}  # heard, before any refresh
        await gauges.refresh()
        assert cooling(text_of(registry)) == {"primary": 1, "spare": 0}  # and the store agrees
        clock[0] += 29
        assert cooling(text_of(registry))["primary"] == 1
        clock[0] += 2
        assert cooling(text_of(registry))["primary"] == 0  # ended, no refresh needed
        await gauges.refresh()
        assert cooling(text_of(registry))["primary"] == 0
        await pool.cool_down(pool.first, None)  # no retry-after: the provider's cooldown_seconds
        clock[0] += 9
        assert cooling(text_of(registry))["primary"] == 1
        clock[0] += 2
        assert cooling(text_of(registry))["primary"] == 0

    asyncio.run(main())
    assert value(text_of(registry), STARTED, portcullis_provider="openai-main", key="primary") == 2
    assert value(text_of(registry), STARTED, key="spare") == 0


def test_a_key_another_replica_cooled_in_redis_shows_here(provider: ProviderConfig, services: Any) -> None:
    prefix = f"{services.redis_prefix}keys-{uuid.uuid4().hex[:6]}:"

    async def main() -> None:
        clients = [aioredis.Redis.from_url(services.redis_url) for _ in range(2)]
        try:
            capacities = [RedisCapacity(client, prefix) for client in clients]  # two replicas on one Redis
            pools = [KeyPool(provider, capacity) for capacity in capacities]
            (registry_a, _), (registry_b, gauges_b) = (gauges_for({"openai-main": p}, c) for p, c in zip(pools, capacities, strict=True))
            await pools[0].cool_down(pools[0].first, 1)  # replica A got the 429
            assert cooling(text_of(registry_a))["primary"] == 1
            assert cooling(text_of(registry_b))["primary"] == 0  # B has not read the store yet
            await gauges_b.refresh()
            assert cooling(text_of(registry_b)) == {"primary": 1, "spare": 0}
            assert value(text_of(registry_b), STARTED) == 0 and value(text_of(registry_a), STARTED) == 1  # each counts its own
            await asyncio.sleep(1.1)
            assert cooling(text_of(registry_b))["primary"] == 0  # ended at the time Redis gave, between refreshes
            await gauges_b.refresh()
            assert cooling(text_of(registry_b))["primary"] == 0
        finally:
            for client in clients:
                await client.aclose()

    asyncio.run(main())


def test_a_key_another_worker_cooled_shows_in_every_worker(provider: ProviderConfig) -> None:
    async def main() -> None:
        announcer = Announcer()
        host = StateHost({"capacity": AnnouncedCapacity(announcer)}, {"capacity": ALLOWED["capacity"]}, announcer)
        clients, serving = [], []
        for _ in range(2):
            ours, theirs = socket.socketpair()
            serving.append(asyncio.ensure_future(host.serve(ours, lambda _: None)))
            clients.append(StateClient(theirs))
            await clients[-1].connect()
        capacities = [SharedCapacity(client) for client in clients]
        pools = [KeyPool(provider, capacity) for capacity in capacities]
        registry_b, gauges_b = gauges_for({"openai-main": pools[1]}, capacities[1])
        await pools[0].cool_down(pools[0].first, 30)
        for _ in range(100):  # the host announces it a moment later
            await gauges_b.refresh()
            if cooling(text_of(registry_b))["primary"] == 1:
                break
            await asyncio.sleep(0.01)
        assert cooling(text_of(registry_b)) == {"primary": 1, "spare": 0}
        for client in clients:
            await client.close()
        await asyncio.gather(*serving)

    asyncio.run(main())


class Unreadable:
    """A capacity whose cool-downs cannot be read (Redis gone), or read as ``answer``."""

    def __init__(self) -> None:
        self.answer: dict[tuple[str, str], float] | None = None
        self.during_read: Any = None

    async def take(self, provider: str, keys: Sequence[KeyAllowance], tokens: int, start: int) -> Taken:
        return Taken(0, 0)

    async def cool_down(self, provider: str, key: str, seconds: float) -> None:
        return None

    async def cooling(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        if self.during_read is not None:
            self.during_read()
        if self.answer is None:
            raise StoreUnavailable("Redis is unavailable at redis://:hunter2@10.0.0.5")
        return self.answer


def test_the_store_is_the_authority_and_an_unreadable_one_changes_nothing(provider: ProviderConfig, caplog: pytest.LogCaptureFixture) -> None:
    clock = [5_000.0]
    capacity = Unreadable()
    pool = KeyPool(provider, capacity)  # type: ignore[arg-type]
    registry, gauges = gauges_for({"openai-main": pool}, capacity, clock=lambda: clock[0])

    async def main() -> None:
        await pool.cool_down(pool.first, 20)
        await gauges.refresh()  # unreadable: never raises, the known cool-down stands
        await gauges.refresh()
        assert cooling(text_of(registry))["primary"] == 1
        clock[0] += 21
        assert cooling(text_of(registry))["primary"] == 0  # and still ends on time
        capacity.answer = {("openai-main", "spare"): 5.0}  # readable again: another replica cooled the spare
        await gauges.refresh()
        assert cooling(text_of(registry)) == {"primary": 0, "spare": 1}
        capacity.answer = {}  # the store no longer has it (a later, shorter cool-down): over
        await gauges.refresh()
        assert cooling(text_of(registry)) == {"primary": 0, "spare": 0}
        capacity.during_read = lambda: gauges.cooled("openai-main", "primary", 10)  # recorded while the store was read
        await gauges.refresh()
        assert cooling(text_of(registry))["primary"] == 1  # the older answer does not undo it

    asyncio.run(main())
    assert len([r for r in caplog.records if r.name == "portcullis.metrics"]) == 1  # once per outage
    assert "StoreUnavailable" in caplog.text and "hunter2" not in caplog.text
