"""The state host and its proxies (``workers: N`` on the embedded store): a real
socketpair between a host and a client, the real in-memory objects behind it."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from portcullis.adapters.pii.vault import MemoryVault, VaultUnavailable
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.capacity import KeyAllowance, MemoryCapacity, Taken
from portcullis.adapters.store.hosted import ALLOWED, AnnouncedCapacity, SharedCapacity, proxy, shared_vault
from portcullis.adapters.store.limiter import MemoryFailureCounter
from portcullis.adapters.store.state_host import READY, Announcer, HostedProxy, StateClient, StateHost, decode, encode


class Faulty:
    async def refuse(self) -> None:
        raise StoreUnavailable("the embedded store is full")

    async def break_down(self, value: str) -> None:
        raise KeyError(value)  # its text (a caller's value) must not cross the channel

    async def vault_down(self) -> None:
        raise VaultUnavailable("sealed")

    async def secret(self) -> str:
        return "not on the allow-list"


FAULTY_METHODS = frozenset({"refuse", "break_down", "vault_down"})


async def connected(objects: dict[str, object], allowed: dict[str, frozenset[str]]) -> tuple[StateClient, asyncio.Task[None], list[tuple[Any, ...]]]:
    ours, theirs = socket.socketpair()
    controls: list[tuple[Any, ...]] = []
    serving = asyncio.ensure_future(StateHost(objects, allowed).serve(ours, controls.append))
    client = StateClient(theirs)
    await client.connect()
    return client, serving, controls


def with_host(scenario: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``scenario`` with (client, the hosted objects, control messages received)."""
    asyncio.run(_with_host(scenario))


async def _with_host(scenario: Callable[[Any], Awaitable[None]]) -> None:
    objects: dict[str, object] = {
        "auth_failures": MemoryFailureCounter(5, 60),
        "capacity": MemoryCapacity(),
        "vault": MemoryVault(),
        "faulty": Faulty(),
    }
    allowed = {name: ALLOWED[name] for name in ("auth_failures", "capacity", "vault")} | {"faulty": FAULTY_METHODS}
    client, serving, controls = await connected(objects, allowed)
    try:
        await scenario((client, objects, controls))
    finally:
        await client.close()
    await serving


def test_calls_reach_the_one_hosted_object() -> None:
    async def scenario(hosted: Any) -> None:
        client, objects, _ = hosted
        failures = proxy(client, "auth_failures")
        for _ in range(5):
            await failures.record_failure("203.0.113.9")
        assert await failures.retry_after("203.0.113.9") is not None
        assert await objects["auth_failures"].retry_after("203.0.113.9") is not None  # the host's own object counted them
        assert await failures.retry_after("203.0.113.10") is None
        taken = await proxy(client, "capacity").take("anthropic", [KeyAllowance("k1", rpm=1, tpm=None)], 10, 0)
        assert taken == Taken(0, 0)  # dataclasses cross both ways
        assert (await proxy(client, "capacity").take("anthropic", [KeyAllowance("k1", rpm=1, tpm=None)], 10, 0)).index is None

    with_host(scenario)


def test_concurrent_calls_are_multiplexed_and_exact() -> None:
    async def scenario(hosted: Any) -> None:
        client, _, _ = hosted
        capacity = proxy(client, "capacity")
        keys = [KeyAllowance("k1", rpm=37, tpm=None)]
        taken = await asyncio.gather(*(capacity.take("openai", keys, 1, 0) for _ in range(300)))
        assert sum(1 for t in taken if t.index == 0) == 37  # a hard rpm holds under 300 concurrent calls
        vault = shared_vault(client)
        # Many concurrent assigns, each answer the one its own call asked for (ids, not order, match them).
        placeholders = await asyncio.gather(*(vault.assign(f"scope{i % 7}", "pseudonym", [("EMAIL", f"u{i}@example.com")], 60) for i in range(200)))
        revealed = await asyncio.gather(*(vault.reveal(f"scope{i % 7}", placeholders[i]) for i in range(200)))
        assert [found[placeholders[i][0]] for i, found in enumerate(revealed)] == [f"u{i}@example.com" for i in range(200)]

    with_host(scenario)


def test_the_allow_list_is_enforced_on_both_ends() -> None:
    async def scenario(hosted: Any) -> None:
        client, _, _ = hosted
        faulty = HostedProxy(client, "faulty", FAULTY_METHODS)
        with pytest.raises(AttributeError):
            faulty.secret  # noqa: B018 - the attribute itself is refused
        with pytest.raises(AttributeError):
            proxy(client, "auth_failures")._windows  # noqa: B018 - private state is not reachable
        # A worker that asks anyway (a forged proxy) is refused by the host.
        forged = HostedProxy(client, "faulty", frozenset({"secret"}))
        with pytest.raises(StoreUnavailable, match="NotAllowed"):
            await forged.secret()
        with pytest.raises(StoreUnavailable, match="NotAllowed"):
            await HostedProxy(client, "nothing-hosted", frozenset({"get"})).get("k")
        assert await proxy(client, "auth_failures").retry_after("x") is None  # and the channel still serves

    with_host(scenario)


def test_errors_are_mapped_without_their_values() -> None:
    async def scenario(hosted: Any) -> None:
        client, _, _ = hosted
        faulty = HostedProxy(client, "faulty", FAULTY_METHODS)
        with pytest.raises(StoreUnavailable, match="the embedded store is full"):
            await faulty.refuse()
        with pytest.raises(StoreUnavailable) as unexpected:
            await faulty.break_down("alice@example.com")
        assert "alice" not in str(unexpected.value) and "KeyError" in str(unexpected.value)
        shared_vault(client)  # registers VaultUnavailable, as a worker does
        with pytest.raises(VaultUnavailable, match="sealed"):
            await faulty.vault_down()

    with_host(scenario)


def test_a_host_that_goes_away_fails_closed() -> None:
    asyncio.run(_host_goes_away())


async def _host_goes_away() -> None:
    class Slow:
        async def wait(self) -> None:
            await asyncio.sleep(30)

    ours, theirs = socket.socketpair()
    host = asyncio.ensure_future(
        StateHost({"slow": Slow(), "auth_failures": MemoryFailureCounter(5, 60)}, {"slow": frozenset({"wait"}), **ALLOWED}).serve(ours, lambda _: None)
    )
    client = StateClient(theirs)
    await client.connect()
    lost: list[bool] = []
    client.on_lost(lambda: lost.append(True))
    pending = asyncio.ensure_future(HostedProxy(client, "slow", frozenset({"wait"})).wait())
    await asyncio.sleep(0.05)
    host.cancel()  # the supervisor dies with a call in flight
    ours.close()
    with pytest.raises(StoreUnavailable, match="unavailable"):
        await pending
    with pytest.raises(StoreUnavailable, match="unavailable"):
        await proxy(client, "auth_failures").retry_after("x")
    with pytest.raises(VaultUnavailable):
        await shared_vault(client).reveal("scope", ["<EMAIL_1>"])
    assert lost == [True]
    await client.close()


def test_control_messages_reach_the_supervisor() -> None:
    async def scenario(hosted: Any) -> None:
        client, _, controls = hosted
        client.notify(READY)
        await proxy(client, "auth_failures").retry_after("x")  # answered after the notice was read
        assert controls == [(READY,)]

    with_host(scenario)


def test_unpickling_resolves_only_this_packages_dataclasses() -> None:
    assert decode(encode((1, True, Taken(0, 0)))[4:]) == (1, True, Taken(0, 0))
    assert decode(encode(frozenset({"a"}))[4:]) == frozenset({"a"})
    with pytest.raises(pickle.UnpicklingError):
        decode(pickle.dumps(os.system))
    with pytest.raises(pickle.UnpicklingError):
        decode(pickle.dumps(MemoryFailureCounter(1, 1)))  # a class, but not a plain record


def test_cool_downs_are_announced_and_keys_without_limits_are_judged_locally() -> None:
    async def scenario() -> None:
        announcer = Announcer()
        host = StateHost({"capacity": AnnouncedCapacity(announcer)}, {"capacity": ALLOWED["capacity"]}, announcer)
        clients, serving = [], []
        for _ in range(2):
            ours, theirs = socket.socketpair()
            serving.append(asyncio.ensure_future(host.serve(ours, lambda _: None)))
            clients.append(StateClient(theirs))
            await clients[-1].connect()
        first, second = SharedCapacity(clients[0]), SharedCapacity(clients[1])
        unlimited = [KeyAllowance("k1", None, None), KeyAllowance("k2", None, None)]
        assert await second.take("openai", unlimited, 10, 0) == Taken(0, 0)
        await first.cool_down("openai", "k1", 30)
        assert await first.take("openai", unlimited, 10, 0) == Taken(1, 0)  # heard before its own call returned
        for _ in range(50):  # the other worker hears it a moment later
            if (await second.take("openai", unlimited, 10, 0)).index == 1:
                break
            await asyncio.sleep(0.01)
        assert await second.take("openai", unlimited, 10, 0) == Taken(1, 0)
        ours, theirs = socket.socketpair()  # a worker started later hears what still holds
        serving.append(asyncio.ensure_future(host.serve(ours, lambda _: None)))
        clients.append(StateClient(theirs))
        late = SharedCapacity(clients[-1])
        await clients[-1].connect()
        await late.take("openai", [KeyAllowance("k1", 1, None)], 10, 0)  # a limited key: a host round trip, after the snapshot
        assert await late.take("openai", unlimited, 10, 0) == Taken(1, 0)
        limited = [KeyAllowance("k3", 2, None)]
        assert [(await c.take("openai", limited, 1, 0)).index for c in (first, second, late)] == [0, 0, None]  # exact at the host
        for client in clients:
            await client.close()
        await asyncio.gather(*serving)

    asyncio.run(scenario())
