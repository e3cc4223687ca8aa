"""What the supervisor hosts for its workers on the embedded store, and the methods each
worker may call (the allow-list ``StateHost`` enforces).

Every entry is per-process state with a correctness meaning: a limit or a memory that
N workers must see as one. Per-process caches that only save work (authenticated keys,
integrity scan results) stay in each worker. The SQLite ledger is shared through its
file and needs no host. The shared store (Redis + PostgreSQL) hosts nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from portcullis.adapters.store.capacity import KeyAllowance, MemoryCapacity, Taken
from portcullis.adapters.store.state_host import Announcer, HostedProxy, StateClient, StateHost, register_error

if TYPE_CHECKING:
    from portcullis.adapters.config import Config
    from portcullis.adapters.pii.vault import Vault
    from portcullis.adapters.store import FailureCounter, Store

COUNT_WINDOW_SECONDS = 60  # count_limit's windows (adapters/count_limit.py)
COOLED = "cooled"  # the event: (COOLED, provider, key name, until: epoch seconds)

ALLOWED: dict[str, frozenset[str]] = {
    "auth_failures": frozenset({"retry_after", "record_failure"}),
    "capacity": frozenset({"take", "cool_down"}),
    "replays": frozenset({"first_sighting", "forget"}),
    "sessions": frozenset({"get", "put_if_absent", "put"}),
    "breakers": frozenset({"view", "failed", "succeeded", "claim_probe", "release_probe"}),
    "vault": frozenset({"assign", "reveal"}),
    "count_windows": frozenset({"retry_after", "record_failure"}),
}


def build_host(config: Config) -> StateHost:
    announcer = Announcer()
    return StateHost(host_objects(config, announcer), ALLOWED, announcer)


def host_objects(config: Config, announcer: Announcer) -> dict[str, object]:
    """The real in-memory objects, built once in the supervisor with the settings a single
    gateway process would use."""
    from portcullis.adapters.pii.vault import MemoryVault, VaultUnavailable
    from portcullis.adapters.store.breakers import MemoryBreakerBoard
    from portcullis.adapters.store.limiter import MemoryFailureCounter
    from portcullis.adapters.store.replay import MemoryReplayGuard
    from portcullis.adapters.store.session_state import MemorySessionState

    register_error(VaultUnavailable)  # its text crosses the channel too
    return {
        "auth_failures": MemoryFailureCounter(config.max_auth_failures, config.auth_failure_window),
        "capacity": AnnouncedCapacity(announcer),
        "replays": MemoryReplayGuard(),
        "sessions": MemorySessionState(),
        "breakers": MemoryBreakerBoard(),
        "vault": MemoryVault(config.pii.max_sessions),
        "count_windows": MemoryFailureCounter(config.count_tokens_per_minute, COUNT_WINDOW_SECONDS),
    }


def proxy(client: StateClient, name: str) -> Any:
    return HostedProxy(client, name, ALLOWED[name])


def shared_store(store: Store, client: StateClient) -> Store:
    """The embedded store with its in-memory parts replaced by the host's (keys and the
    ledger stay: they are the SQLite file every worker opens)."""
    return dataclasses.replace(
        store,
        auth_failures=proxy(client, "auth_failures"),
        capacity=SharedCapacity(client),
        replays=proxy(client, "replays"),
        sessions=proxy(client, "sessions"),
        breakers=proxy(client, "breakers"),
    )


def shared_vault(client: StateClient) -> Vault:
    from portcullis.adapters.pii.vault import VaultUnavailable

    register_error(VaultUnavailable)
    # An unreachable host is the vault being unavailable: the PII policy's on_error decides.
    return cast("Vault", HostedProxy(client, "vault", ALLOWED["vault"], unavailable=VaultUnavailable))


def shared_count_windows(client: StateClient) -> FailureCounter:
    return cast("FailureCounter", proxy(client, "count_windows"))


class AnnouncedCapacity:
    """The host's provider-key capacity; each cool-down is also announced to every worker."""

    def __init__(self, announcer: Announcer) -> None:
        self._inner = MemoryCapacity()
        self._announcer = announcer
        self._until: dict[tuple[str, str], float] = {}
        announcer.snapshot(self._cooling)

    async def take(self, provider: str, keys: Sequence[KeyAllowance], tokens: int, start: int) -> Taken:
        return await self._inner.take(provider, keys, tokens, start)

    async def cool_down(self, provider: str, key: str, seconds: float) -> None:
        await self._inner.cool_down(provider, key, seconds)
        self._until[(provider, key)] = time.time() + seconds
        self._announcer.announce(COOLED, provider, key, self._until[(provider, key)])

    def _cooling(self) -> list[tuple[Any, ...]]:
        now = time.time()
        self._until = {cooling: until for cooling, until in self._until.items() if until > now}
        return [(COOLED, provider, key, until) for (provider, key), until in self._until.items()]


class SharedCapacity:
    """A worker's view of the hosted capacity. Keys with an rpm or tpm are taken at the
    host (exact across workers); for keys without, only cool-downs matter, and the host
    announces those to every worker, so they are judged here without a round trip on
    every request. (The host applies a cool-down before it answers the worker that asked,
    so that worker has heard it by then; others hear it a moment later.)"""

    def __init__(self, client: StateClient) -> None:
        self._hosted = proxy(client, "capacity")
        self._heard_cooling = MemoryCapacity()  # the announced cool-downs, judged as the host would
        client.on_event(self._heard)

    def _heard(self, event: tuple[Any, ...]) -> None:
        if event[0] == COOLED:
            _, provider, key, until = event
            self._heard_cooling.cool_until(provider, key, until)

    async def take(self, provider: str, keys: Sequence[KeyAllowance], tokens: int, start: int) -> Taken:
        if any(key.rpm is not None or key.tpm is not None for key in keys):
            return cast(Taken, await self._hosted.take(provider, keys, tokens, start))
        return await self._heard_cooling.take(provider, keys, tokens, start)

    async def cool_down(self, provider: str, key: str, seconds: float) -> None:
        await self._hosted.cool_down(provider, key, seconds)

    async def cooling(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """The cool-downs heard from the host (every worker's, and those that held when
        this worker connected): no round trip."""
        return await self._heard_cooling.cooling(keys)
