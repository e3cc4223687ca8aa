"""Inbound AWS Signature Version 4, as Bedrock Runtime clients sign (boto3 with service
name ``bedrock``, ``AnthropicBedrock``). No other gateway verifies it, so these clients
could only reach one with a bearer token; here they sign with an access key the
gateway issued (``portcullis keys create --aws``).

What is checked, in two steps because the signature covers the body:

* from the headers alone (``parse``): the ``Authorization`` header's shape, the
  credential scope (``<day>/<any region>/bedrock/aws4_request``, the day equal to
  ``x-amz-date``'s), that ``host`` and ``x-amz-date`` are signed, and the clock skew
  (±15 minutes of the gateway's clock);
* once the body is read (``verify``): the canonical request rebuilt from what actually
  arrived (method, the raw path as sent, the canonical query, the signed headers'
  values, the SHA-256 of the body received, which must equal ``x-amz-content-sha256``
  when that is sent), signed with the credential's secret and compared in constant time.

The canonical URI follows botocore for non-S3 services: the path as sent, dot segments
and empty segments removed, percent-encoded once more (``%3A`` becomes ``%253A``).
Refusals name what failed, never the secret, the signature or the string to sign.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from starlette.datastructures import Headers

from portcullis.engine.errors import ErrorKind, GatewayError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "bedrock"
TERMINATOR = "aws4_request"
MAX_SKEW = dt.timedelta(minutes=15)
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")
_REGION = re.compile(r"[a-z0-9-]{1,32}")
_PRESIGN_PARAMETERS = {"x-amz-signature", "x-amz-credential", "x-amz-algorithm"}
_MAX_SIGNED_HEADERS = 64


@dataclass(frozen=True)
class SignedRequest:
    """What the ``Authorization`` header claims, checked for shape, scope and freshness."""

    access_key_id: str
    day: str
    region: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str

    @property
    def scope(self) -> str:
        return f"{self.day}/{self.region}/{SERVICE}/{TERMINATOR}"


@dataclass(frozen=True)
class Arrived:
    """The request as it reached the gateway, before any decoding."""

    method: str
    raw_path: bytes
    query: bytes
    headers: Headers  # getlist() keeps repeated headers apart
    body: bytes


def refusal(code: str, message: str) -> GatewayError:
    return GatewayError(ErrorKind.PERMISSION, message, code=code)


def is_sigv4(headers: Mapping[str, str]) -> bool:
    return headers.get("authorization", "").startswith(ALGORITHM)


def is_presigned(query: str) -> bool:
    """Query-string authentication (a presigned URL): not accepted, since a URL is
    easily logged and shared while the credential it carries stays valid."""
    return any(pair.partition("=")[0].lower() in _PRESIGN_PARAMETERS for pair in query.split("&"))


def parse(headers: Mapping[str, str], now: dt.datetime) -> SignedRequest:
    scheme, _, rest = headers.get("authorization", "").partition(" ")
    malformed = refusal(
        "incomplete_signature", "the Authorization header must be AWS4-HMAC-SHA256 Credential=<access key>/<scope>, SignedHeaders=..., Signature=..."
    )
    if scheme != ALGORITHM:
        raise malformed
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals or name in fields:
            raise malformed
        fields[name] = value
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise malformed
    credential = fields["Credential"].split("/")
    signed_headers = tuple(fields["SignedHeaders"].split(";"))
    if len(credential) != 5 or not _HEX_SIGNATURE.fullmatch(fields["Signature"]) or len(signed_headers) > _MAX_SIGNED_HEADERS:
        raise malformed
    if not all(_HEADER_NAME.fullmatch(name) for name in signed_headers) or len(set(signed_headers)) != len(signed_headers):
        raise malformed
    access_key_id, day, region, service, terminator = credential
    if service != SERVICE or terminator != TERMINATOR or not _REGION.fullmatch(region):
        raise refusal("invalid_signature", f"the credential scope must be <date>/<region>/{SERVICE}/{TERMINATOR}")
    if "host" not in signed_headers or "x-amz-date" not in signed_headers:
        raise refusal("incomplete_signature", "the signed headers must include host and x-amz-date")
    amz_date = headers.get("x-amz-date", "")
    try:
        if not _AMZ_DATE.fullmatch(amz_date):
            raise ValueError
        signed_at = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        raise refusal("incomplete_signature", "x-amz-date must be a UTC time as yyyymmddThhmmssZ") from None
    if day != amz_date[:8]:
        raise refusal("invalid_signature", "the credential scope's date must be x-amz-date's day")
    if abs(now - signed_at) > MAX_SKEW:
        raise refusal("signature_expired", "the signature has expired: x-amz-date is more than 15 minutes from the gateway's clock")
    return SignedRequest(access_key_id, day, region, signed_headers, fields["Signature"], amz_date)


def canonical_uri(raw_path: str) -> str:
    """The path as sent, percent-encoded once more. A path with dot or empty segments is
    refused: SigV4 signs it resolved, but the gateway routes it as sent, so what was signed
    would not be what is served (botocore never sends one)."""
    segments = raw_path.removesuffix("/").split("/")[1:]  # a trailing slash is a path of its own
    if any(segment in ("", ".", "..") for segment in segments):
        raise refusal("invalid_signature", "the signed path has empty or dot segments")
    return quote(raw_path or "/", safe="/~")


def canonical_query(query: str) -> str:
    """Each name and value decoded then encoded the one AWS way, sorted."""
    if not query:
        return ""
    pairs = []
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_request(signed: SignedRequest, arrived: Arrived, payload_hash: str) -> str:
    lines = [arrived.method.upper()]
    try:
        path = arrived.raw_path.decode("utf-8")
        query = arrived.query.decode("utf-8")
    except UnicodeDecodeError:
        raise refusal("invalid_signature", "the request target is not valid UTF-8") from None
    lines += [canonical_uri(path), canonical_query(query)]
    for name in signed.signed_headers:
        values = arrived.headers.getlist(name)
        if not values:
            raise refusal("invalid_signature", f"signed header {name} was not sent")
        lines.append(f"{name}:{','.join(' '.join(value.split()) for value in values)}")
    lines += ["", ";".join(signed.signed_headers), payload_hash]
    return "\n".join(lines)


def payload_hash(arrived: Arrived) -> str:
    """The SHA-256 of the body received; a declared ``x-amz-content-sha256`` must match it."""
    actual = hashlib.sha256(arrived.body).hexdigest()
    declared = arrived.headers.getlist("x-amz-content-sha256")
    if declared and (len(declared) > 1 or declared[0].strip().lower() != actual):
        if declared[0].strip().startswith(("UNSIGNED-PAYLOAD", "STREAMING-")):
            raise refusal("invalid_signature", "the body must be signed: unsigned and streaming payloads are not accepted")
        raise refusal("invalid_signature", "the body received does not match x-amz-content-sha256")
    return actual


def signature(secret: str, signed: SignedRequest, canonical: str) -> str:
    string_to_sign = "\n".join((ALGORITHM, signed.amz_date, signed.scope, hashlib.sha256(canonical.encode()).hexdigest()))
    key = f"AWS4{secret}".encode()
    for part in (signed.day, signed.region, SERVICE, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def verify(signed: SignedRequest, secret: str, arrived: Arrived) -> None:
    expected = signature(secret, signed, canonical_request(signed, arrived, payload_hash(arrived)))
    if not hmac.compare_digest(expected.encode(), signed.signature.encode()):
        raise refusal(
            "invalid_signature", "the request signature does not match: check the secret access key and that nothing changed the request after signing"
        )
