"""The fake AWS account behind the fake Bedrock Runtime, and SigV4 verification as AWS
does it: the signature is recomputed (with botocore's signer) from what arrived on the
wire — the raw, still percent-encoded path, the signed headers' values and the exact
body bytes — with the secret of the access key the request names, and compared.

What AWS refuses, the fake refuses with the same status, ``x-amzn-ErrorType`` and
message: no signature, an unknown key or session token, a credential scoped to another
service or region, a stale ``X-Amz-Date`` (±15 minutes) and a signature that does not
match (a changed path, header or body).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from dataclasses import dataclass, field

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ACCESS_KEY = "AKIAFAKEBEDROCK00001"
SECRET_KEY = "fake/bedrock/secret/key/0000000000000000"
SERVICE = "bedrock"
SKEW = dt.timedelta(minutes=15)
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,\s*"
    r"SignedHeaders=(?P<signed>[a-z0-9;-]+),\s*Signature=(?P<signature>[0-9a-f]{64})"
)


@dataclass(frozen=True)
class AwsKey:
    secret: str
    token: str | None = None  # temporary credentials: requests must carry this session token


@dataclass
class AwsAccount:
    region: str = "us-east-1"
    account_id: str = "123456789012"
    keys: dict[str, AwsKey] = field(default_factory=lambda: {ACCESS_KEY: AwsKey(SECRET_KEY)})
    verifies: bool = True  # False only for the benchmark's direct baseline, which wrk cannot sign


@dataclass(frozen=True)
class Refusal:
    status: int
    error_type: str
    message: str


@dataclass(frozen=True)
class Signed:
    access_key: str
    token: str | None


def verify(account: AwsAccount, method: str, raw_path: str, query: str, headers: dict[str, str], body: bytes) -> Signed | Refusal:
    """The request's signer, or why AWS would refuse it. ``headers``: lower-case names."""
    authorization = headers.get("authorization")
    if not authorization:
        return Refusal(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    match = _AUTHORIZATION.fullmatch(authorization.strip())
    if match is None:
        return Refusal(403, "IncompleteSignatureException", "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters.")
    key = account.keys.get(match["key"])
    token = headers.get("x-amz-security-token")
    if key is None or key.token != token:
        return Refusal(403, "UnrecognizedClientException", "The security token included in the request is invalid.")
    if match["service"] != SERVICE:
        return Refusal(403, "InvalidSignatureException", f"Credential should be scoped to correct service: '{SERVICE}'. ")
    if match["region"] != account.region:
        return Refusal(403, "InvalidSignatureException", f"Credential should be scoped to a valid region, not '{match['region']}'. ")
    signed = match["signed"].split(";")
    amz_date = headers.get("x-amz-date", "")
    if "host" not in signed or "x-amz-date" not in signed:
        return Refusal(403, "InvalidSignatureException", "'Host' and 'X-Amz-Date' must be signed headers.")
    try:
        when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return Refusal(403, "IncompleteSignatureException", "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
    now = dt.datetime.now(dt.UTC)
    if abs(now - when) > SKEW or match["date"] != amz_date[:8]:
        return Refusal(403, "InvalidSignatureException", f"Signature expired: {amz_date} is now earlier than {(now - SKEW):%Y%m%dT%H%M%SZ}.")
    declared = headers.get("x-amz-content-sha256")
    if declared is not None and declared != hashlib.sha256(body).hexdigest():
        return Refusal(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
    values = {name: headers.get(name, "") for name in signed}
    expected = signature(Credentials(match["key"], key.secret, key.token), match["region"], amz_date, method, raw_path, query, values, body)
    if not hmac.compare_digest(expected, match["signature"]):
        return Refusal(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method.",
        )
    return Signed(match["key"], token)


def signature(credentials: Credentials, region: str, amz_date: str, method: str, raw_path: str, query: str, signed: dict[str, str], body: bytes) -> str:
    """The SigV4 signature of a request as received. botocore's canonical request encodes
    the path once more (``%3A`` → ``%253A``), as AWS does for every service but S3."""
    host = signed.get("host", "localhost")
    request = AWSRequest(method=method, url=f"http://{host}{raw_path}" + (f"?{query}" if query else ""), data=body, headers=signed)
    request.context["timestamp"] = amz_date
    auth = SigV4Auth(credentials, SERVICE, region)
    return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
