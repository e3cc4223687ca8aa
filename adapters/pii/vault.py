"""The vault: which placeholder stands for which value, per scope.

A scope is a session of one principal in one team (pseudonyms) or a whole team
(tokens). Within a scope the same value always gets the same placeholder, assigned
atomically, so concurrent requests of one session agree. Values never leave the
vault except through ``reveal`` on the same scope; the audit log never sees them.

Embedded, the vault lives in the process: bounded, expiring, and gone on restart —
then a placeholder an answer refers to cannot be restored and the answer is withheld
(fail closed). Shared, it is a Redis hash per scope with a TTL; with a vault key the
lookup fields are HMACs (a phone number's SHA-256 is easy to reverse by enumeration)
and the values are sealed with AES-GCM bound to their scope, so a value copied into
another scope does not open.
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
from typing import Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from redis.asyncio import Redis
from redis.exceptions import RedisError

from portcullis.engine.pii.redaction import pseudonym, token

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
    forward: dict[tuple[str, str], str] = field(default_factory=dict)
    reverse: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


class MemoryVault:
    def __init__(self, max_scopes: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()
        self._max_scopes = max_scopes
        self._clock = clock

    async def assign(self, scope: str, kind: str, items: Sequence[tuple[str, str]], ttl: int) -> list[str]:
        now = self._clock()
        held = self._live(scope, now) or _Scope(now + ttl)
        held.expires = now + ttl
        self._scopes[scope] = held
        self._scopes.move_to_end(scope)
        while len(self._scopes) > self._max_scopes:
            self._scopes.popitem(last=False)
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
        held = self._scopes.get(scope)
        if held is not None and held.expires <= now:
            del self._scopes[scope]
            return None
        return held


# --- shared ---------------------------------------------------------------------------

# KEYS[1]: the scope's hash. ARGV: ttl, kind, then per item: entity, lookup, sealed
# value, token id. Returns the placeholders, or an error naming a token collision.
_ASSIGN = """
local key, ttl, kind = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local out = {}
for i = 3, #ARGV, 4 do
  local entity, lookup, sealed, token = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local placeholder = redis.call('HGET', key, 'f:' .. lookup)
  if not placeholder then
    if kind == 'pseudonym' then
      placeholder = '<' .. entity .. '_' .. redis.call('HINCRBY', key, 'n:' .. entity, 1) .. '>'
    else
      placeholder = '<' .. entity .. '_TKN_' .. token .. '>'
      if redis.call('HEXISTS', key, 'r:' .. placeholder) == 1 then
        return redis.error_reply('token collision')
      end
    end
    redis.call('HSET', key, 'f:' .. lookup, placeholder, 'r:' .. placeholder, sealed)
  end
  out[#out + 1] = placeholder
end
redis.call('EXPIRE', key, ttl)
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
            args += [entity, self._lookup(scope, entity, value), self._seal(scope, value), new_token_id()]
        for _ in range(3):  # a token id that collides is drawn again
            try:
                found = await self._assign(keys=[self._name(scope)], args=args)
                return [p.decode() if isinstance(p, bytes) else p for p in found]
            except RedisError as error:
                if "token collision" not in str(error):
                    raise VaultUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
                args[5::4] = [new_token_id() for _ in items]
        raise VaultUnavailable("no free token id after three draws")

    async def reveal(self, scope: str, placeholders: Sequence[str]) -> dict[str, str]:
        if not placeholders:
            return {}
        try:
            sealed = await self._redis.hmget(self._name(scope), [f"r:{p}" for p in placeholders])
        except RedisError as error:
            raise VaultUnavailable(f"Redis is unavailable: {type(error).__name__}") from None
        found = {}
        for placeholder, value in zip(placeholders, sealed, strict=True):
            opened = self._open(scope, value) if value is not None else None
            if opened is not None:
                found[placeholder] = opened
        return found

    def _name(self, scope: str) -> str:
        return f"{self._prefix}vault:{scope}"

    def _lookup(self, scope: str, entity: str, value: str) -> str:
        message = f"{scope}\x1f{entity}\x1f{value}".encode()
        if self._key is None:
            return hashlib.sha256(message).hexdigest()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _seal(self, scope: str, value: str) -> str:
        if self._aead is None:
            return "p:" + value
        nonce = os.urandom(12)
        return "s:" + base64.b64encode(nonce + self._aead.encrypt(nonce, value.encode(), scope.encode())).decode()

    def _open(self, scope: str, stored: bytes | str) -> str | None:
        text = stored.decode() if isinstance(stored, bytes) else stored
        if text.startswith("p:"):
            return text[2:]
        if self._aead is None or not text.startswith("s:"):
            return None
        blob = base64.b64decode(text[2:])
        try:
            return self._aead.decrypt(blob[:12], blob[12:], scope.encode()).decode()
        except Exception:  # sealed for another scope or with another key: not this scope's value
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
