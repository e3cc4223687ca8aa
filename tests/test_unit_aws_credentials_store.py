"""AWS credentials in both stores (SQLite and a real PostgreSQL): stored sealed,
listed and revoked with the virtual keys, re-sealed under a newer key; and the replay
memory in process and in a real Redis."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from portcullis.adapters.auth import create_key
from portcullis.adapters.aws_credentials import SealKeys, create_aws_credential, reseal_all
from portcullis.adapters.store import SealedSecret, Store
from portcullis.adapters.store.limiter import MemoryFailureCounter
from portcullis.adapters.store.postgres import PostgresKeyStore
from portcullis.adapters.store.replay import MemoryReplayGuard, RedisReplayGuard
from portcullis.adapters.store.sqlite import SqliteKeyStore

OLD, NEW = SealKeys([b"o" * 32]), SealKeys([b"n" * 32, b"o" * 32])  # NEW: a key added in front of the old one


@asynccontextmanager
async def open_keys(kind: str, tmp_path: Path, services: Any) -> AsyncIterator[Store]:
    keys: Any = SqliteKeyStore.open(tmp_path / "keys.db") if kind == "embedded" else await PostgresKeyStore.open(services.database_url)
    store = Store(keys, MemoryFailureCounter(10, 60), None, None)  # type: ignore[arg-type]  # keys only
    try:
        yield store
    finally:
        await keys.close()


@pytest.fixture(params=["embedded", "shared"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def run_with(kind: str, tmp_path: Path, request: pytest.FixtureRequest, action: Any) -> Any:
    services = request.getfixturevalue("services") if kind == "shared" else None

    async def go() -> Any:
        async with open_keys(kind, tmp_path, services) as store:
            return await action(store)

    return asyncio.run(go())


def test_a_credential_is_stored_sealed_and_found_by_its_access_key(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def action(store: Store) -> None:
        record, secret = await create_aws_credential(store, OLD, "eng", "alice", "ci")
        found = await store.keys.find_aws_credential(record.key_id)
        assert found is not None
        stored, sealed = found
        assert (stored.key_id, stored.team, stored.user, stored.name, stored.revoked_at) == (record.key_id, "eng", "alice", "ci", None)
        assert OLD.unseal(stored, sealed) == secret and secret.encode() not in sealed.blob
        assert await store.keys.find_aws_credential("PCAKAAAAAAAAAAAAAAAA") is None

    run_with(kind, tmp_path, request, action)


def test_credentials_are_listed_and_revoked_with_the_virtual_keys(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def action(store: Store) -> None:
        key, _ = await create_key(store, "eng", None, None)
        credential, _ = await create_aws_credential(store, OLD, "eng", None, None)
        listed = {record.key_id for record in await store.keys.list_keys()}
        assert {key.key_id, credential.key_id} <= listed
        assert await store.keys.revoke_key(credential.key_id, dt.datetime.now(dt.UTC))
        assert not await store.keys.revoke_key(credential.key_id, dt.datetime.now(dt.UTC))  # already revoked
        found = await store.keys.find_aws_credential(credential.key_id)
        assert found is not None and found[0].revoked_at is not None
        assert next(r for r in await store.keys.list_keys() if r.key_id == key.key_id).revoked_at is None  # the other key stays
        assert await store.keys.revoke_key(key.key_id, dt.datetime.now(dt.UTC))

    run_with(kind, tmp_path, request, action)


def test_reseal_moves_every_secret_to_the_newest_key(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def action(store: Store) -> None:
        issued = [await create_aws_credential(store, OLD, "eng", f"u{i}", None) for i in range(3)]
        resealed, unopenable = await reseal_all(store, NEW)
        assert unopenable == [] and resealed >= 3
        for record, secret in issued:
            found = await store.keys.find_aws_credential(record.key_id)
            assert found is not None and found[1].seal_key_id == NEW.newest_id
            assert SealKeys([b"n" * 32]).unseal(found[0], found[1]) == secret  # the old key is no longer needed
        assert await reseal_all(store, NEW) == (0, [])  # nothing left to do

    run_with(kind, tmp_path, request, action)


def test_reseal_reports_secrets_no_configured_key_opens(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def action(store: Store) -> list[str]:
        lost, _ = await create_aws_credential(store, SealKeys([b"l" * 32]), "eng", None, None)
        _, unopenable = await reseal_all(store, NEW)
        return [lost.key_id] if lost.key_id in unopenable else unopenable

    assert len(run_with(kind, tmp_path, request, action)) == 1


def test_a_seal_changed_meanwhile_is_not_overwritten(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def action(store: Store) -> None:
        record, _ = await create_aws_credential(store, OLD, "eng", None, None)
        found = await store.keys.find_aws_credential(record.key_id)
        assert found is not None
        stale = SealedSecret(found[1].seal_key_id, b"\0" * len(found[1].blob))
        assert not await store.keys.replace_sealed(record.key_id, stale, NEW.seal(record, "s" * 40))
        assert await store.keys.replace_sealed(record.key_id, found[1], NEW.seal(record, "s" * 40))

    run_with(kind, tmp_path, request, action)


def test_postgres_holds_no_plaintext_secret(tmp_path: Path, services: Any) -> None:
    async def action(store: Store) -> str:
        _, secret = await create_aws_credential(store, OLD, "eng", None, None)
        return secret

    secret = asyncio.run(_with_shared(services, action))
    with psycopg.connect(services.database_url) as connection:
        rows = connection.execute("SELECT * FROM aws_credentials").fetchall()
    dumped = b"".join(value.encode() if isinstance(value, str) else bytes(value) for row in rows for value in row if isinstance(value, (str, bytes)))
    assert rows and secret.encode() not in dumped


async def _with_shared(services: Any, action: Any) -> Any:
    async with open_keys("shared", Path("."), services) as store:
        return await action(store)


def test_the_memory_replay_guard_remembers_for_its_window() -> None:
    now = [0.0]
    guard = MemoryReplayGuard(clock=lambda: now[0])

    async def run() -> list[bool]:
        seen = [await guard.first_sighting("a" * 64, 1000), await guard.first_sighting("a" * 64, 1000)]
        now[0] = 1.5
        return [*seen, await guard.first_sighting("a" * 64, 1000)]

    assert asyncio.run(run()) == [True, False, True]


def test_the_redis_replay_guard_is_shared_and_expires(services: Any) -> None:
    prefix = f"{services.redis_prefix}replay-{uuid.uuid4().hex[:6]}:"

    async def run() -> tuple[list[bool], int, list[bytes]]:
        client = aioredis.Redis.from_url(services.redis_url)
        try:
            one, other = RedisReplayGuard(client, prefix), RedisReplayGuard(client, prefix)  # two replicas
            seen = [await one.first_sighting("b" * 64, 60_000), await other.first_sighting("b" * 64, 60_000)]
            ttl = await client.pttl(f"{prefix}sigv4-seen:{'b' * 64}")
            keys = await client.keys(f"{prefix}*")
            await other.forget("b" * 64)
            seen.append(await one.first_sighting("b" * 64, 60_000))
            await client.delete(*await client.keys(f"{prefix}*"))
            return seen, ttl, keys
        finally:
            await client.aclose()

    seen, ttl, keys = asyncio.run(run())
    assert seen == [True, False, True]
    assert 0 < ttl <= 60_000 and all(key.decode().startswith(prefix) for key in keys)
