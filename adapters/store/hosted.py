"""What the supervisor hosts for its workers on the embedded store, and the methods each
worker may call (the allow-list ``StateHost`` enforces).

Every entry is per-process state with a correctness meaning: a limit or a memory that
N workers must see as one. Per-process caches that only save work (authenticated keys,
integrity scan results) stay in each worker. The SQLite ledger is shared through its
file and needs no host. The shared store (Redis + PostgreSQL) hosts nothing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from portcullis.adapters.store.state_host import HostedProxy, StateClient, register_error

if TYPE_CHECKING:
    from portcullis.adapters.config import Config
    from portcullis.adapters.pii.vault import Vault
    from portcullis.adapters.store import FailureCounter, Store

COUNT_WINDOW_SECONDS = 60  # count_limit's windows (adapters/count_limit.py)

ALLOWED: dict[str, frozenset[str]] = {
    "auth_failures": frozenset({"retry_after", "record_failure"}),
    "capacity": frozenset({"take", "cool_down"}),
    "replays": frozenset({"first_sighting", "forget"}),
    "sessions": frozenset({"get", "put_if_absent", "put"}),
    "breakers": frozenset({"view", "failed", "succeeded", "claim_probe", "release_probe"}),
    "vault": frozenset({"assign", "reveal"}),
    "count_windows": frozenset({"retry_after", "record_failure"}),
}


def host_objects(config: Config) -> dict[str, object]:
    """The real in-memory objects, built once in the supervisor with the settings a single
    gateway process would use."""
    from portcullis.adapters.pii.vault import MemoryVault, VaultUnavailable
    from portcullis.adapters.store.breakers import MemoryBreakerBoard
    from portcullis.adapters.store.capacity import MemoryCapacity
    from portcullis.adapters.store.limiter import MemoryFailureCounter
    from portcullis.adapters.store.replay import MemoryReplayGuard
    from portcullis.adapters.store.session_state import MemorySessionState

    register_error(VaultUnavailable)  # its text crosses the channel too
    return {
        "auth_failures": MemoryFailureCounter(config.max_auth_failures, config.auth_failure_window),
        "capacity": MemoryCapacity(),
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
        capacity=proxy(client, "capacity"),
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
