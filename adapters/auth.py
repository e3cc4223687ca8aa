"""Stage 1: virtual keys. A key is shown once when created; only its SHA-256 is
stored. Identity comes from the key record, never from caller-supplied headers, and
failed attempts are throttled per client address."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from portcullis.adapters.store import KeyRecord, Store, StoreUnavailable
from portcullis.engine.errors import ErrorKind, GatewayError

KEY_PREFIX = "pk-"
_MAX_KEY_LENGTH = 256
_CACHE_LIMIT = 50_000


@dataclass(frozen=True)
class Principal:
    key_id: str
    team: str
    user: str | None

    def as_input(self) -> dict[str, str | None]:
        return {"key_id": self.key_id, "team": self.team, "user": self.user}


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """(key_id, secret key): 256 bits of entropy; the id is public, the key is not."""
    return f"key_{secrets.token_hex(8)}", KEY_PREFIX + secrets.token_urlsafe(32)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key from ``x-api-key`` (Anthropic SDKs 0.x/1.x, Claude Code) or
    ``Authorization: Bearer`` (Anthropic SDK 2.x, OpenAI SDKs)."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


async def create_key(store: Store, team: str, user: str | None, name: str | None) -> tuple[KeyRecord, str]:
    key_id, key = new_key()
    record = KeyRecord(key_id, team, user, name, dt.datetime.now(dt.UTC), None)
    await store.keys.create_key(record, hash_key(key))
    return record, key


class Authenticator:
    def __init__(self, store: Store, cache_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cache: dict[str, tuple[Principal, float]] = {}

    async def authenticate(self, headers: Mapping[str, str], client: str) -> Principal:
        """The principal behind the presented key. A key verified within the last
        ``cache_seconds`` needs no lookup; every lookup is throttled per client address."""
        key = presented_key(headers)
        digest = hash_key(key) if key else ""
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > self._clock():
            return cached[0]
        try:
            retry_after = await self._store.auth_failures.retry_after(client)
            if retry_after is not None:
                raise GatewayError(
                    ErrorKind.RATE_LIMITED, "too many failed authentication attempts; try again later", code="auth_rate_limited", retry_after=retry_after
                )
            if key is None:
                await self._fail(client, "missing API key: send it as x-api-key or Authorization: Bearer", "missing_api_key")
            if not key.startswith(KEY_PREFIX) or len(key) > _MAX_KEY_LENGTH:
                await self._fail(client, "invalid API key", "invalid_api_key")
            record = await self._store.keys.find_by_hash(digest)
            if record is None:
                await self._fail(client, "invalid API key", "invalid_api_key")
            if record.revoked_at is not None:
                await self._fail(client, "API key has been revoked", "revoked_api_key")
        except StoreUnavailable:
            raise GatewayError(ErrorKind.UNAVAILABLE, "the gateway cannot verify keys right now; try again shortly", code="store_unavailable") from None
        principal = Principal(record.key_id, record.team, record.user)
        if self._cache_seconds > 0:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[digest] = (principal, self._clock() + self._cache_seconds)
        return principal

    async def _fail(self, client: str, message: str, code: str) -> None:
        await self._store.auth_failures.record_failure(client)
        raise GatewayError(ErrorKind.AUTHENTICATION, message, code=code)
