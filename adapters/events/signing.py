"""Standard Webhooks signatures (https://www.standardwebhooks.com/): what lets an
operator's endpoint tell the gateway's events from anyone else's POST, and a replay
from a fresh one.

Each message carries ``webhook-id`` (the same on every retry, so receivers can
de-duplicate), ``webhook-timestamp`` (unix seconds of this attempt, so a captured
request goes stale) and ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of
``{id}.{timestamp}.{body}`` under the shared secret, several space-separated while a
secret is being rotated. Secrets are written ``whsec_<base64>``, the form the
standard's libraries (and Svix's) read, so a receiver can verify with any of them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24  # the standard's floor: shorter keys are guessable offline from one signed message
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
_VERSION = "v1"


def parse_secret(text: str) -> bytes:
    """The key in ``whsec_<base64>``. The error never repeats the text: it is a secret."""
    if not isinstance(text, str) or not text.strip().startswith(SECRET_PREFIX):
        raise ValueError(f"webhook secret: expected the Standard Webhooks form {SECRET_PREFIX}<base64>")
    encoded = text.strip()[len(SECRET_PREFIX) :]
    encoded += "=" * (-len(encoded) % 4)  # some generators drop the padding
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"webhook secret: the part after {SECRET_PREFIX} is not base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"webhook secret: decodes to {len(key)} bytes; at least {MIN_SECRET_BYTES} are needed")
    return key


def generate_secret() -> str:
    """A fresh 32-byte secret in the form ``parse_secret`` reads, for operators to share."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def new_message_id() -> str:
    """``msg_`` and 26 base32 characters (128 random bits): unique without coordination."""
    return "msg_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def sign(secret: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of the message."""
    return _signature(secret, message_id, str(int(timestamp)), body)


def _signature(secret: bytes, message_id: str, stamp: str, body: bytes) -> str:
    """Over the timestamp exactly as the header spells it, as receivers compute it."""
    signed = f"{message_id}.{stamp}.".encode() + body
    return f"{_VERSION}," + base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()


def signature_headers(secret: bytes | Sequence[bytes], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt. Several secrets (old and new, while rotating)
    give one signature each, so receivers holding either one accept the message."""
    keys = [secret] if isinstance(secret, bytes | bytearray) else list(secret)
    if not keys:
        raise ValueError("webhook signature: at least one secret is needed")
    return {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(int(timestamp)),
        SIGNATURE_HEADER: " ".join(sign(bytes(key), message_id, timestamp, body) for key in keys),
    }


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, now: int, tolerance_seconds: int = 300) -> bool:
    """Whether one of the message's ``v1`` signatures is ``secret``'s and its timestamp is
    within ``tolerance_seconds`` of ``now``: what a receiver checks before trusting it.
    Header names are matched case-insensitively; anything malformed is simply False."""
    lowered = {str(name).lower(): value for name, value in headers.items()}
    message_id, stamp, signatures = lowered.get(ID_HEADER), lowered.get(TIMESTAMP_HEADER), lowered.get(SIGNATURE_HEADER)
    if not message_id or not stamp or not signatures:
        return False
    stamp = stamp.strip()
    if not stamp.isascii() or not stamp.isdigit():
        return False
    if abs(int(now) - int(stamp)) > tolerance_seconds:
        return False
    expected = _signature(secret, message_id, stamp, body).encode()
    matched = False
    for candidate in signatures.split():
        if candidate.startswith(f"{_VERSION},"):  # other versions (v1a: asymmetric) are not ours to check
            matched |= hmac.compare_digest(expected, candidate.encode())
    return matched
