"""AWS-style credentials for Bedrock Runtime clients that sign with SigV4 (boto3,
``AnthropicBedrock``): an access key id that names the credential (``PCAK`` and 16
base32 characters, public) and a 40-character secret, shown once.

A SigV4 signature is an HMAC keyed by the secret, so verifying one needs the secret
itself: unlike a virtual key it cannot be kept as a hash. It is kept sealed instead,
with AES-256-GCM under a server key from the environment; the access key id, team and
user are the associated data, so a sealed secret copied onto another row does not
open. Several seal keys may be configured for rotation: the newest seals, every one
unseals, and ``portcullis keys reseal`` moves every secret to the newest."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from portcullis.adapters.config import AwsCredentialsConfig
from portcullis.adapters.store import KeyRecord, SealedSecret, Store

ACCESS_KEY_PREFIX = "PCAK"
ACCESS_KEY_LENGTH = len(ACCESS_KEY_PREFIX) + 16
_NONCE_BYTES = 12


class SealError(Exception):
    """A sealed secret no configured key opens (its key is gone, or the row was altered)."""


def new_credential() -> tuple[str, str]:
    """(access key id, secret): 80 random bits name the credential, 240 make the secret."""
    return ACCESS_KEY_PREFIX + base64.b32encode(secrets.token_bytes(10)).decode(), secrets.token_urlsafe(30)


def is_access_key_id(value: str) -> bool:
    body = value[len(ACCESS_KEY_PREFIX) :]
    return len(value) == ACCESS_KEY_LENGTH and value.startswith(ACCESS_KEY_PREFIX) and all(ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" for ch in body)


def seal_key_id(key: bytes) -> str:
    """A public name for a seal key, stored beside what it sealed (never the key)."""
    return hashlib.sha256(b"portcullis-seal-key-id\0" + key).hexdigest()[:16]


def _associated_data(record: KeyRecord) -> bytes:
    return "\0".join(("portcullis-aws-credential", record.key_id, record.team, record.user or "")).encode()


class SealKeys:
    def __init__(self, keys: list[bytes]) -> None:
        if not keys or any(len(key) != 32 for key in keys):
            raise ValueError("seal keys are 32 bytes each, newest first")
        self._newest = keys[0]
        self._by_id = {seal_key_id(key): AESGCM(key) for key in keys}

    @property
    def newest_id(self) -> str:
        return seal_key_id(self._newest)

    def seal(self, record: KeyRecord, secret: str) -> SealedSecret:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = AESGCM(self._newest).encrypt(nonce, secret.encode(), _associated_data(record))
        return SealedSecret(self.newest_id, nonce + sealed)

    def unseal(self, record: KeyRecord, sealed: SealedSecret) -> str:
        cipher = self._by_id.get(sealed.seal_key_id)
        if cipher is None:
            raise SealError(f"credential {record.key_id} is sealed with key {sealed.seal_key_id}, which is not configured")
        try:
            return cipher.decrypt(sealed.blob[:_NONCE_BYTES], sealed.blob[_NONCE_BYTES:], _associated_data(record)).decode()
        except (InvalidTag, UnicodeDecodeError):
            raise SealError(f"credential {record.key_id} does not unseal: its stored secret or owner was altered") from None


async def create_aws_credential(store: Store, seal: SealKeys, team: str, user: str | None, name: str | None) -> tuple[KeyRecord, str]:
    access_key_id, secret = new_credential()
    record = KeyRecord(access_key_id, team, user, name, dt.datetime.now(dt.UTC), None)
    await store.keys.create_aws_credential(record, seal.seal(record, secret))
    return record, secret


async def reseal_all(store: Store, seal: SealKeys) -> tuple[int, list[str]]:
    """Re-seal every stored secret not sealed by the newest key: (how many were, the
    access key ids that no configured key opens, left as they are)."""
    resealed, unopenable = 0, []
    for record, sealed in await store.keys.aws_credentials():
        if sealed.seal_key_id == seal.newest_id:
            continue
        try:
            secret = seal.unseal(record, sealed)
        except SealError:
            unopenable.append(record.key_id)
            continue
        if await store.keys.replace_sealed(record.key_id, sealed, seal.seal(record, secret)):
            resealed += 1
    return resealed, unopenable


def configured_seal(config: AwsCredentialsConfig) -> SealKeys | None:
    """The configured seal keys, or None when SigV4 is not configured."""
    keys = config.seal_keys()
    return SealKeys(keys) if keys else None
