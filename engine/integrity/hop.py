"""Authenticated gateway-hop metadata for the policy prompt (seed §7.2 rule 2).

When one Portcullis forwards to another (a regional gateway behind a central one),
the first inserts the policy prompt and says so in a header the next can verify:
``v1;t=<unix seconds>;sha256=<prompt hash>[;b=<boundary suffix>];mac=<HMAC-SHA256 of
the rest under the shared hop key>``. The next gateway skips its own insertion only
when the MAC holds, the timestamp is fresh, the hash is the prompt it would insert
and that very text leads the request; an authentic header also names the previous
gateway's untrusted-content boundaries, so they are not wrapped again or mistaken
for injected tags. Anything a caller writes (a marker, a copy of the text, an
unsigned or stale header) never suppresses insertion.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

HEADER = "x-portcullis-policy-prompt"
MAX_AGE_SECONDS = 300
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class HopClaim:
    """What an authentic header says: the prompt the previous gateway put in front, and
    the boundary suffix its untrusted-content tags use (None when it wrapped nothing)."""

    prompt_sha256: str
    boundary: str | None


def sign(key: bytes, prompt_sha256: str, boundary: str | None, now: int) -> str:
    payload = f"v1;t={now};sha256={prompt_sha256}" + (f";b={boundary}" if boundary else "")
    return f"{payload};mac={_mac(key, payload)}"


def read(key: bytes, header: str | None, now: int) -> HopClaim | None:
    """The claim of an authentic, fresh header; None for anything else."""
    if not header or len(header) > 256 or not header.isascii():
        return None
    payload, _, mac = header.rpartition(";mac=")
    if not payload.startswith("v1;") or not hmac.compare_digest(mac, _mac(key, payload)):
        return None
    fields = dict(part.split("=", 1) for part in payload.split(";")[1:] if "=" in part)
    stamp, sha, boundary = fields.get("t", ""), fields.get("sha256", ""), fields.get("b")
    if not stamp.isdigit() or abs(now - int(stamp)) > MAX_AGE_SECONDS or not set(sha) <= _HEX or len(sha) != 64:
        return None
    return HopClaim(sha, boundary if boundary and set(boundary) <= _HEX else None)


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
