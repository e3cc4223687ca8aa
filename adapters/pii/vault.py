"""The vault: which placeholder stands for which value, per scope.

A scope is a session of one principal in one team (pseudonyms) or a whole team
(tokens). Within a scope the same value always gets the same placeholder, assigned
atomically, so concurrent requests of one session agree. Values never leave the
vault except through ``reveal`` on the same scope; the audit log never sees them.

Embedded, the vault lives in the process: bounded, expiring, and gone on restart —
then a placeholder an answer refers to cannot be restored and the answer is withheld
(fail closed). Shared, each mapping is a Redis key with its own TTL, refreshed on use;
with a vault key the lookups are HMACs (a phone number's SHA-256 is easy to reverse by
enumeration) and the values are sealed with AES-GCM bound to their scope and
placeholder, so a value copied to another session or placeholder does not open.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from portcullis.adapters.store import redis_errors
from portcullis.engine.pii.redaction import pseudonym, token

if TYPE_CHECKING:
    from redis.asyncio import Redis

PSEUDONYM = "pseudonym"
TOKEN = "token"


class VaultUnavailable(Exception):
    """The vault cannot be reached or refused the operation; the PII policy's
    ``on_error`` decides what happens to the request."""


class Vault(Protocol):
    async def assign(self, scope: str, kind: str, items: Sequence[tuple[str, str]], ttl: int) -> list[str]:
        """The placeholder of each (entity, value), creating those not yet assigned."""
        ...

    async def reveal(self, scope: str, placeholders: Sequence[str]) -> dict[str, str]:
        """The values of the placeholders the scope knows; the others are absent."""
        ...


def scope_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def new_token_id() -> str:
    return secrets.token_hex(5)


# --- embedded -----------------------------------------------------------------------


@dataclass
class _Scope:
    expires: float
    forward: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)  # values: never in a repr
    reverse: dict[str, str] = field(default_factory=dict, repr=False)
    counters: dict[str, int] = field(default_factory=dict)


class MemoryVault:
    """Sessions and teams' token scopes are bounded separately, so a churn of sessions
    never evicts the tokens a team's readers rely on."""

    def __init__(self, max_scopes: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._scopes: dict[str, OrderedDict[str, _Scope]] = {PSEUDONYM: OrderedDict(), TOKEN: OrderedDict()}
        self._max_scopes = max_scopes
        self._clock = clock

    async def assign(self, scope: str, kind: str, items: Sequence[tuple[str, str]], ttl: int) -> list[str]:
        now = self._clock()
        scopes = self._scopes[kind]
        held = self._live(scope, now) or _Scope(now + ttl)
        held.expires = now + ttl
        scopes[scope] = held
        scopes.move_to_end(scope)
        while len(scopes) > self._max_scopes:
            scopes.popitem(last=False)
        placeholders = []
        for entity, value in items:
            placeholder = held.forward.get((entity, value))
            if placeholder is None:
                if kind == PSEUDONYM:
                    held.counters[entity] = held.counters.get(entity, 0) + 1
                    placeholder = pseudonym(entity, held.counters[entity])
                else:
                    placeholder = token(entity, new_token_id())
                    while placeholder in held.reverse:
                        placeholder = token(entity, new_token_id())
                held.forward[(entity, value)] = placeholder
                held.reverse[placeholder] = value
            placeholders.append(placeholder)
        return placeholders

    async def reveal(self, scope: str, placeholders: Sequence[str]) -> dict[str, str]:
        held = self._live(scope, self._clock())
        if held is None:
            return {}
        return {p: held.reverse[p] for p in placeholders if p in held.reverse}

    def _live(self, scope: str, now: float) -> _Scope | None:
        for scopes in self._scopes.values():
            held = scopes.get(scope)
            if held is not None and held.expires <= now:
                del scopes[scope]
                return None
            if held is not None:
                return held
        return None


# --- shared ---------------------------------------------------------------------------

# One key per mapping, each with its own TTL refreshed on use, so a team's unused
# tokens expire one by one. Keys share the scope as a hash tag (one cluster slot).
# KEYS[1]: the scope's key prefix. ARGV: ttl, kind, then per item: entity, lookup,
# token id. Returns, per item, the placeholder and 1 when it is new (its value is then
# written by the caller, sealed to the placeholder it got).
_ASSIGN = """
local base, ttl, kind = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local out = {}
for i = 3, #ARGV, 3 do
  local entity, lookup, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local placeholder = redis.call('GET', base .. 'f:' .. lookup)
  local new = 0
  if placeholder then
    redis.call('EXPIRE', base .. 'f:' .. lookup, ttl)
    redis.call('EXPIRE', base .. 'r:' .. placeholder, ttl)
  else
    if kind == 'pseudonym' then
      local n = redis.call('INCR', base .. 'n:' .. entity)
      redis.call('EXPIRE', base .. 'n:' .. entity, ttl)
      placeholder = '<' .. entity .. '_' .. n .. '>'
    else
      placeholder = '<' .. entity .. '_TKN_' .. token .. '>'
      if redis.call('EXISTS', base .. 'f-of:' .. placeholder) == 1 then
        return redis.error_reply('token collision')
      end
      redis.call('SET', base .. 'f-of:' .. placeholder, lookup, 'EX', ttl)
    end
    redis.call('SET', base .. 'f:' .. lookup, placeholder, 'EX', ttl)
    new = 1
  end
  out[#out + 1] = placeholder
  out[#out + 1] = new
end
return out
"""


class RedisVault:
    def __init__(self, redis: Redis, prefix: str, key: bytes | None) -> None:
        self._redis = redis
        self._prefix = prefix
        self._key = key
        self._aead = AESGCM(key) if key is not None else None
        self._assign = redis.register_script(_ASSIGN)

    async def assign(self, scope: str, kind: str, items: Sequence[tuple[str, str]], ttl: int) -> list[str]:
        args: list[str | int] = [ttl, kind]
        for entity, value in items:
            args += [entity, self._lookup(scope, entity, value), new_token_id()]
        try:
            for _ in range(3):  # a token id that collides is drawn again
                try:
                    found = await self._assign(keys=[self._base(scope)], args=args)
                    break
                except redis_errors.ResponseError as error:
                    if "token collision" not in str(error):
                        raise
                    args[4::3] = [new_token_id() for _ in items]
            else:
                raise VaultUnavailable("no free token id after three draws")
            placeholders = [p.decode() if isinstance(p, bytes) else p for p in found[0::2]]
            new = {p: value for p, fresh, (_, value) in zip(placeholders, found[1::2], items, strict=True) if int(fresh)}
            if new:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for placeholder, value in new.items():
                        pipe.set(f"{self._base(scope)}r:{placeholder}", self._seal(scope, placeholder, value), ex=ttl)
                    await pipe.execute()
        except redis_errors.RedisError as error:
            raise VaultUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        return placeholders

    async def reveal(self, scope: str, placeholders: Sequence[str]) -> dict[str, str]:
        if not placeholders:
            return {}
        try:
            sealed = await self._redis.mget([f"{self._base(scope)}r:{p}" for p in placeholders])
        except redis_errors.RedisError as error:
            raise VaultUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        found = {}
        for placeholder, value in zip(placeholders, sealed, strict=True):
            opened = self._open(scope, placeholder, value) if value is not None else None
            if opened is not None:
                found[placeholder] = opened
        return found

    def _base(self, scope: str) -> str:
        return f"{self._prefix}vault:{{{scope}}}:"

    def _lookup(self, scope: str, entity: str, value: str) -> str:
        message = f"{scope}\x1f{entity}\x1f{value}".encode()
        if self._key is None:
            return hashlib.sha256(message).hexdigest()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _seal(self, scope: str, placeholder: str, value: str) -> str:
        if self._aead is None:
            return "p:" + value
        nonce = os.urandom(12)
        # Bound to scope and placeholder: a value moved to another session, or swapped
        # with another placeholder's, does not open.
        bound = f"{scope}\x1f{placeholder}".encode()
        return "s:" + base64.b64encode(nonce + self._aead.encrypt(nonce, value.encode(), bound)).decode()

    def _open(self, scope: str, placeholder: str, stored: bytes | str) -> str | None:
        text = stored.decode() if isinstance(stored, bytes) else stored
        if self._aead is None:
            return text[2:] if text.startswith("p:") else None
        if not text.startswith("s:"):
            return None  # unsealed while a key is set: not trusted
        try:
            blob = base64.b64decode(text[2:], validate=True)
            return self._aead.decrypt(blob[:12], blob[12:], f"{scope}\x1f{placeholder}".encode()).decode()
        except Exception:  # damaged, or sealed for another scope, placeholder or key: not this one's value
            return None


def vault_key(encoded: str) -> bytes:
    """A vault key from its configured form: 32 bytes, base64 or hex."""
    text = encoded.strip()
    for decode in (bytes.fromhex, base64.b64decode):
        try:
            key = decode(text)
        except ValueError:
            continue
        if len(key) == 32:
            return key
    raise ValueError("the vault key must be 32 bytes, hex or base64 encoded")
