"""Stage 1: virtual keys. A key is shown once when created; only its SHA-256 is
stored. Identity comes from the key record, never from caller-supplied headers, and
failed attempts are throttled per client address.

Bedrock Runtime clients may sign with SigV4 instead, using an AWS-style credential
(``aws_credentials.py``). A signature covers the body, so it is checked in two steps:
``claim`` settles a key, or checks a signature's header, scope, freshness and access
key before any body is read; ``confirm`` verifies the signature once it is
(``sigv4.py``)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from starlette.requests import Request

from portcullis.adapters import sigv4
from portcullis.adapters.aws_credentials import SealError, SealKeys, is_access_key_id
from portcullis.adapters.ingress import client_address
from portcullis.adapters.store import KeyRecord, SealedSecret, Store, StoreUnavailable
from portcullis.engine.errors import ErrorKind, GatewayError

log = logging.getLogger("portcullis.auth")

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


@dataclass(frozen=True)
class PendingSignature:
    """A SigV4 request whose header, scope, date and access key passed; its signature
    is verified once the body it covers has been read."""

    signed: sigv4.SignedRequest
    record: KeyRecord
    sealed: SealedSecret
    client: str


@dataclass(frozen=True)
class Claim:
    """Who a request says it is from: a key's principal, settled from the headers, or a
    pending signature's (``principal`` is None until ``Authenticator.confirm``)."""

    principal: Principal | None
    signature: PendingSignature | None = None


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
    def __init__(
        self,
        store: Store,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        seal: SealKeys | None = None,  # None: SigV4 requests are refused
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._store = store
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._seal = seal
        self._now = now
        self._cache: dict[str, tuple[Principal, float]] = {}
        self._credentials: dict[str, tuple[KeyRecord, SealedSecret, float]] = {}  # by access key id

    async def claim(self, http: Request) -> Claim:
        """A key's principal, or a SigV4 signature checked as far as the headers allow."""
        client = client_address(http)
        query = http.scope.get("query_string", b"").decode("latin-1")
        if sigv4.is_sigv4(http.headers) or sigv4.is_presigned(query):
            return Claim(None, await self._claim_signature(http.headers, query, client))
        return Claim(await self.authenticate(http.headers, client))

    async def confirm(self, claim: Claim, http: Request, body: bytes) -> Principal:
        """The principal once the signature is verified over what arrived, body included."""
        if claim.principal is not None:
            return claim.principal
        pending = claim.signature
        assert pending is not None and self._seal is not None  # claim() refuses SigV4 without seal keys
        try:
            secret = self._seal.unseal(pending.record, pending.sealed)
        except SealError as error:
            log.error("SigV4: %s", error)
            raise GatewayError(ErrorKind.UNAVAILABLE, "the gateway cannot verify this credential right now", code="credential_unavailable") from None
        raw_path, _, _ = (http.scope.get("raw_path") or http.scope["path"].encode()).partition(b"?")
        arrived = sigv4.Arrived(http.method, raw_path, http.scope.get("query_string", b""), http.headers, body)
        try:
            try:
                sigv4.verify(pending.signed, secret, arrived)
            except GatewayError as error:
                await self._refuse(pending.client, error)
            if not await self._store.replays.first_sighting(pending.signed.signature, 2 * int(sigv4.MAX_SKEW.total_seconds() * 1000)):
                await self._refuse(pending.client, sigv4.refusal("replayed_request", "this signed request was already received: sign each request anew"))
        except StoreUnavailable:
            raise _store_unavailable() from None
        return Principal(pending.record.key_id, pending.record.team, pending.record.user)

    async def release(self, claim: Claim) -> None:
        """Forget a verified signature whose request was refused before anything went
        upstream, so the SDK's retry is not taken for a replay: botocore re-signs each
        attempt, and within the same second of ``x-amz-date`` the signature is the same."""
        if claim.signature is not None:
            try:
                await self._store.replays.forget(claim.signature.signed.signature)
            except StoreUnavailable:
                log.warning("SigV4: could not release a refused request's signature; a retry within its second is refused as a replay")

    async def _claim_signature(self, headers: Mapping[str, str], query: str, client: str) -> PendingSignature:
        try:
            await self._throttle(client)
            if sigv4.is_presigned(query):
                await self._refuse(
                    client,
                    sigv4.refusal(
                        "presigned_not_supported", "presigned requests (X-Amz-Signature in the query) are not accepted: sign the Authorization header"
                    ),
                )
            if self._seal is None:
                raise sigv4.refusal("sigv4_disabled", "this gateway does not accept SigV4 signatures: use its API key as a bearer token")
            try:
                signed = sigv4.parse(headers, self._now())
            except GatewayError as error:
                await self._refuse(client, error)
            record, sealed = await self._credential(signed.access_key_id, client)
        except StoreUnavailable:
            raise _store_unavailable() from None
        return PendingSignature(signed, record, sealed, client)

    async def _credential(self, access_key_id: str, client: str) -> tuple[KeyRecord, SealedSecret]:
        """An active credential; one found within the last ``cache_seconds`` needs no
        lookup (its signature is still verified on every request)."""
        cached = self._credentials.get(access_key_id)
        if cached is not None and cached[2] > self._clock():
            return cached[0], cached[1]
        found = await self._store.keys.find_aws_credential(access_key_id) if is_access_key_id(access_key_id) else None
        if found is None:
            await self._refuse(client, sigv4.refusal("unrecognized_client", "the access key id is not recognised"))
        record, sealed = found
        if record.revoked_at is not None:
            await self._refuse(client, sigv4.refusal("revoked_access_key", "the access key has been revoked"))
        if self._cache_seconds > 0:
            if len(self._credentials) >= _CACHE_LIMIT:
                self._credentials.clear()
            self._credentials[access_key_id] = (record, sealed, self._clock() + self._cache_seconds)
        return record, sealed

    async def authenticate(self, headers: Mapping[str, str], client: str) -> Principal:
        """The principal behind the presented key. A key verified within the last
        ``cache_seconds`` needs no lookup; every lookup is throttled per client address."""
        key = presented_key(headers)
        digest = hash_key(key) if key else ""
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > self._clock():
            return cached[0]
        try:
            await self._throttle(client)
            if key is None and sigv4.is_sigv4(headers):
                await self._fail(client, "this endpoint takes an API key (x-api-key or Authorization: Bearer), not a SigV4 signature", "missing_api_key")
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
            raise _store_unavailable() from None
        principal = Principal(record.key_id, record.team, record.user)
        if self._cache_seconds > 0:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[digest] = (principal, self._clock() + self._cache_seconds)
        return principal

    async def _throttle(self, client: str) -> None:
        retry_after = await self._store.auth_failures.retry_after(client)
        if retry_after is not None:
            raise GatewayError(
                ErrorKind.RATE_LIMITED, "too many failed authentication attempts; try again later", code="auth_rate_limited", retry_after=retry_after
            )

    async def _fail(self, client: str, message: str, code: str) -> NoReturn:
        await self._refuse(client, GatewayError(ErrorKind.AUTHENTICATION, message, code=code))

    async def _refuse(self, client: str, error: GatewayError) -> NoReturn:
        await self._store.auth_failures.record_failure(client)
        raise error


def _store_unavailable() -> GatewayError:
    return GatewayError(ErrorKind.UNAVAILABLE, "the gateway cannot verify keys right now; try again shortly", code="store_unavailable")
