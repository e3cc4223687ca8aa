"""Inbound SigV4: requests signed by real botocore (``SigV4Auth`` on an ``AWSRequest``,
as boto3's bedrock-runtime client signs) with a credential the gateway issued, turned
into the ASGI request the gateway would receive and verified by the real
``Authenticator`` over an embedded store."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.requests import Request

from portcullis.adapters import sigv4
from portcullis.adapters.auth import Authenticator, Claim, Principal, create_key
from portcullis.adapters.aws_credentials import SealKeys, create_aws_credential, is_access_key_id
from portcullis.adapters.config import StoreConfig
from portcullis.adapters.protocols import aws_errors
from portcullis.adapters.store import Store, open_store
from portcullis.engine.errors import ErrorKind, GatewayError
from tests.asgi_requests import arrived_request
from tests.sigv4_helpers import embedded_store

HOST = "127.0.0.1:8080"
MODEL_PATH = "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
ARN_PATH = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-7-sonnet-20250219-v1%3A0/invoke"
RAW_COLON_PATH = "/model/anthropic.claude-3-5-sonnet-20240620-v1:0/invoke"  # as AnthropicBedrock sends it
BODY = json.dumps({"messages": [{"role": "user", "content": [{"text": "hello"}]}]}).encode()
SEAL = SealKeys([bytes(range(32))])


class Gateway:
    """An Authenticator over a real embedded store, with one issued AWS credential."""

    def __init__(self, store: Store, seal: SealKeys | None, offset: dt.timedelta = dt.timedelta(0)) -> None:
        self.store = store
        self.offset = offset
        self.auth = Authenticator(store, 0, seal=seal, now=lambda: dt.datetime.now(dt.UTC) + self.offset)

    def check(self, request: Request) -> Principal:
        async def run() -> Principal:
            claim = await self.auth.claim(request)
            return await self.auth.confirm(claim, request, await request.body())

        return asyncio.run(run())

    def refusal(self, request: Request) -> GatewayError:
        with pytest.raises(GatewayError) as caught:
            self.check(request)
        return caught.value


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from embedded_store(tmp_path)


@pytest.fixture
def credential(store: Store) -> tuple[str, str]:
    record, secret = asyncio.run(create_aws_credential(store, SEAL, "eng", "alice", "laptop"))
    return record.key_id, secret


@pytest.fixture
def gateway(store: Store) -> Gateway:
    return Gateway(store, SEAL)


def sign(
    credential: tuple[str, str],
    path: str = MODEL_PATH,
    body: bytes = BODY,
    service: str = "bedrock",
    region: str = "us-east-1",
    query: str = "",
    headers: dict[str, str] | None = None,
) -> AWSRequest:
    url = f"http://{HOST}{path}" + (f"?{query}" if query else "")
    request = AWSRequest(method="POST", url=url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    SigV4Auth(Credentials(*credential), service, region).add_auth(request)
    return request


def arrived(signed: AWSRequest, body: bytes | None = None, path: str | None = None, headers: dict[str, str] | None = None) -> Request:
    """The request as uvicorn hands it to the gateway: raw path as sent, Host added."""
    prepared = signed.prepare()
    split = urlsplit(prepared.url)
    sent = {"host": split.netloc, **{name.lower(): value for name, value in prepared.headers.items()}, **(headers or {})}
    payload = prepared.body if body is None else body
    payload = payload if isinstance(payload, bytes) else (payload or b"")
    raw_path = (path or split.path).encode()
    scope = {
        "type": "http",
        "method": prepared.method,
        "path": raw_path.decode(),
        "raw_path": raw_path,
        "query_string": split.query.encode(),
        "headers": [(name.encode(), str(value).encode()) for name, value in sent.items()],
        "client": ("10.1.2.3", 40000),
    }
    return arrived_request(scope, payload)


# --- what verifies ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [MODEL_PATH, ARN_PATH, RAW_COLON_PATH])
def test_a_botocore_signed_request_verifies_as_its_principal(gateway: Gateway, credential: tuple[str, str], path: str) -> None:
    principal = gateway.check(arrived(sign(credential, path)))
    assert principal == Principal(credential[0], "eng", "alice")


@pytest.mark.parametrize("path", ["/model/a.b/./converse", "/model//a.b/converse", "/model/x/../a.b/converse"])
def test_a_path_signed_resolved_but_routed_as_sent_is_refused(gateway: Gateway, credential: tuple[str, str], path: str) -> None:
    """SigV4 signs ``/model/a.b/./converse`` as ``/model/a.b/converse``; the gateway would
    route it with the model ``a.b/.``: what was signed is not what would be served."""
    with pytest.raises(GatewayError) as refused:
        gateway.check(arrived(sign(credential, path)))
    assert refused.value.kind == ErrorKind.PERMISSION and refused.value.code == "invalid_signature"


def test_the_canonical_request_is_botocores_for_encoded_ids_arns_and_queries(credential: tuple[str, str]) -> None:
    """The strongest check: the canonical request rebuilt from what arrived is,
    character for character, the one botocore signed (``%3A`` → ``%253A``)."""
    cases = [(MODEL_PATH, ""), (ARN_PATH, ""), (RAW_COLON_PATH, ""), ("/model/b/c/", "b=2&a=1&a=0&empty="), ("/x", "q=a%20b%2Fc&z")]
    for path, query in cases:
        request = sign(credential, path, query=query)
        incoming = arrived(request)
        del request.headers["Authorization"]  # botocore builds the canonical request before adding it
        request.context["timestamp"] = request.headers["X-Amz-Date"]
        expected = SigV4Auth(Credentials(*credential), "bedrock", "us-east-1").canonical_request(request)
        parsed = sigv4.parse(incoming.headers, dt.datetime.now(dt.UTC))
        received = sigv4.Arrived("POST", incoming.scope["raw_path"], incoming.scope["query_string"], incoming.headers, BODY)
        got = sigv4.canonical_request(parsed, received, sigv4.payload_hash(received))
        assert got == expected, path
    assert "%253A" in sigv4.canonical_uri(MODEL_PATH) and "%252F" in sigv4.canonical_uri(ARN_PATH)


def test_a_request_with_a_query_string_verifies(gateway: Gateway, credential: tuple[str, str]) -> None:
    assert gateway.check(arrived(sign(credential, query="trace=on&b=x%20y"))).key_id == credential[0]


def test_an_x_amz_content_sha256_matching_the_body_is_accepted(gateway: Gateway, credential: tuple[str, str]) -> None:
    import hashlib

    signed = sign(credential, headers={"X-Amz-Content-SHA256": hashlib.sha256(BODY).hexdigest()})
    assert gateway.check(arrived(signed)).team == "eng"


def test_a_skew_within_fifteen_minutes_is_accepted(store: Store, credential: tuple[str, str]) -> None:
    for minutes in (-14, 14):
        body = BODY.replace(b"hello", f"hello {minutes}".encode())  # one signature each: the store remembers those seen
        assert Gateway(store, SEAL, dt.timedelta(minutes=minutes)).check(arrived(sign(credential, body=body))).key_id == credential[0]


# --- what is refused -------------------------------------------------------------------


def refused(gateway: Gateway, request: Request, code: str, aws_type: str) -> GatewayError:
    error = gateway.refusal(request)
    assert (error.code, error.kind.status, aws_errors.error_type(error)) == (code, 403, aws_type)
    return error


def test_a_wrong_secret_is_an_invalid_signature(gateway: Gateway, credential: tuple[str, str]) -> None:
    refused(gateway, arrived(sign((credential[0], "x" * 40))), "invalid_signature", "InvalidSignatureException")


@pytest.mark.parametrize(
    "tamper",
    [
        {"body": BODY.replace(b"hello", b"HELLO")},
        {"path": "/model/anthropic.claude-3-opus-20240229-v1%3A0/converse"},
        {"path": MODEL_PATH.replace("%3A", ":")},  # same model, other bytes: what was signed is what was sent
        {"headers": {"content-type": "text/plain"}},
        {"headers": {"host": "gateway.example:8080"}},
    ],
)
def test_a_request_changed_after_signing_is_refused(gateway: Gateway, credential: tuple[str, str], tamper: dict[str, Any]) -> None:
    refused(gateway, arrived(sign(credential), **tamper), "invalid_signature", "InvalidSignatureException")


def test_a_body_that_differs_from_its_declared_hash_is_refused(gateway: Gateway, credential: tuple[str, str]) -> None:
    error = refused(gateway, arrived(sign(credential, headers={"X-Amz-Content-SHA256": "0" * 64})), "invalid_signature", "InvalidSignatureException")
    assert "x-amz-content-sha256" in error.message
    unsigned_payload = arrived(sign(credential, headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}))
    unsigned = refused(gateway, unsigned_payload, "invalid_signature", "InvalidSignatureException")
    assert "unsigned" in unsigned.message


def test_a_signature_for_another_service_is_refused(gateway: Gateway, credential: tuple[str, str]) -> None:
    error = refused(gateway, arrived(sign(credential, service="bedrock-runtime")), "invalid_signature", "InvalidSignatureException")
    assert "bedrock" in error.message


@pytest.mark.parametrize("minutes", [-16, 16])
def test_a_signature_sixteen_minutes_off_the_clock_has_expired(store: Store, credential: tuple[str, str], minutes: int) -> None:
    refused(Gateway(store, SEAL, dt.timedelta(minutes=minutes)), arrived(sign(credential)), "signature_expired", "InvalidSignatureException")


def test_a_scope_date_other_than_x_amz_dates_day_is_refused(gateway: Gateway, credential: tuple[str, str]) -> None:
    request = arrived(sign(credential))
    authorization = request.headers["authorization"]
    day = request.headers["x-amz-date"][:8]
    forged = authorization.replace(f"/{day}/", "/20200101/")
    refused(gateway, arrived(sign(credential), headers={"authorization": forged}), "invalid_signature", "InvalidSignatureException")


def test_the_same_signed_request_twice_is_a_replay(gateway: Gateway, credential: tuple[str, str]) -> None:
    signed = sign(credential)
    gateway.check(arrived(signed))
    refused(gateway, arrived(signed), "replayed_request", "InvalidSignatureException")


def test_a_released_signature_may_be_sent_again_as_the_sdks_retry_sends_it(gateway: Gateway, credential: tuple[str, str]) -> None:
    signed = sign(credential)

    async def first() -> Claim:
        request = arrived(signed)
        claim = await gateway.auth.claim(request)
        await gateway.auth.confirm(claim, request, await request.body())
        return claim

    asyncio.run(gateway.auth.release(asyncio.run(first())))
    assert gateway.check(arrived(signed)).key_id == credential[0]
    refused(gateway, arrived(signed), "replayed_request", "InvalidSignatureException")


def test_a_presigned_request_is_refused(gateway: Gateway, credential: tuple[str, str]) -> None:
    request = AWSRequest(method="POST", url=f"http://{HOST}{MODEL_PATH}", data=BODY)
    SigV4QueryAuth(Credentials(*credential), "bedrock", "us-east-1", expires=300).add_auth(request)
    assert "X-Amz-Signature=" in request.url
    error = refused(gateway, arrived(request), "presigned_not_supported", "AccessDeniedException")
    assert "Authorization header" in error.message


def test_an_unknown_access_key_is_an_unrecognized_client(gateway: Gateway, credential: tuple[str, str]) -> None:
    refused(gateway, arrived(sign(("PCAKAAAAAAAAAAAAAAAA", credential[1]))), "unrecognized_client", "UnrecognizedClientException")
    refused(gateway, arrived(sign(("AKIAIOSFODNN7EXAMPLE", credential[1]))), "unrecognized_client", "UnrecognizedClientException")


def test_a_revoked_access_key_is_refused_before_its_body_is_read(gateway: Gateway, store: Store, credential: tuple[str, str]) -> None:
    assert asyncio.run(store.keys.revoke_key(credential[0], dt.datetime.now(dt.UTC)))
    request = arrived(sign(credential))
    with pytest.raises(GatewayError) as caught:
        asyncio.run(gateway.auth.claim(request))
    assert caught.value.code == "revoked_access_key" and aws_errors.error_type(caught.value) == "UnrecognizedClientException"
    assert not request._stream_consumed  # the body of a refused key is never read


@pytest.mark.parametrize(
    "authorization",
    [
        "AWS4-HMAC-SHA256",
        "AWS4-HMAC-SHA256 Credential=PCAKAAAAAAAAAAAAAAAA/20260101/us-east-1/bedrock/aws4_request",
        "AWS4-HMAC-SHA256 Credential=PCAK/x, SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
        "AWS4-HMAC-SHA256 Credential=PCAKAAAAAAAAAAAAAAAA/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=zz",
        "AWS4-HMAC-SHA256 Credential=a/b/c/d/e, Credential=a/b/c/d/e, SignedHeaders=host, Signature=" + "0" * 64,
        "AWS4-HMAC-SHA256 Credential=PCAKAAAAAAAAAAAAAAAA/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=Host;X-Amz-Date, Signature=" + "0" * 64,
    ],
)
def test_a_malformed_authorization_header_is_an_incomplete_signature(gateway: Gateway, credential: tuple[str, str], authorization: str) -> None:
    refused(gateway, arrived(sign(credential), headers={"authorization": authorization}), "incomplete_signature", "IncompleteSignatureException")


def test_host_and_x_amz_date_must_be_signed(gateway: Gateway, credential: tuple[str, str]) -> None:
    request = arrived(sign(credential))
    without_host = request.headers["authorization"].replace("SignedHeaders=content-type;host;x-amz-date", "SignedHeaders=content-type;x-amz-date")
    assert without_host != request.headers["authorization"]
    error = refused(gateway, arrived(sign(credential), headers={"authorization": without_host}), "incomplete_signature", "IncompleteSignatureException")
    assert "host and x-amz-date" in error.message


def test_a_missing_or_malformed_x_amz_date_is_refused(gateway: Gateway, credential: tuple[str, str]) -> None:
    refused(gateway, arrived(sign(credential), headers={"x-amz-date": "yesterday"}), "incomplete_signature", "IncompleteSignatureException")


def test_refusals_never_carry_the_secret_the_signature_or_the_string_to_sign(gateway: Gateway, credential: tuple[str, str]) -> None:
    signed = sign(credential)
    signature = signed.headers["Authorization"].rsplit("Signature=", 1)[1]
    for request in (arrived(signed, body=b"{}"), arrived(sign(credential, service="s3")), arrived(sign((credential[0], "y" * 40)))):
        error = gateway.refusal(request)
        for secret_part in (credential[1], signature, "AWS4-HMAC-SHA256\n", "aws4_request\n"):
            assert secret_part not in error.message and secret_part not in str(error)


def test_without_a_seal_key_sigv4_is_refused_and_bearer_keys_still_work(store: Store, credential: tuple[str, str]) -> None:
    gateway = Gateway(store, None)
    refused(gateway, arrived(sign(credential)), "sigv4_disabled", "AccessDeniedException")
    _, key = asyncio.run(create_key(store, "eng", "bob", None))
    bearer = arrived(sign(credential), headers={"authorization": f"Bearer {key}"})
    assert gateway.check(bearer) == asyncio.run(gateway.auth.claim(bearer)).principal
    assert gateway.check(bearer).user == "bob"


def test_failed_verifications_throttle_the_client(tmp_path: Path, credential: tuple[str, str], store: Store) -> None:
    throttled = asyncio.run(open_store(StoreConfig(kind="embedded", path=tmp_path / "keys.db"), max_failures=3, window=60))
    try:
        gateway = Gateway(throttled, SEAL)
        for _ in range(3):
            refused(gateway, arrived(sign((credential[0], "z" * 40))), "invalid_signature", "InvalidSignatureException")
        error = gateway.refusal(arrived(sign(credential)))  # even the right secret now waits
        assert error.kind is ErrorKind.RATE_LIMITED and error.code == "auth_rate_limited" and error.retry_after
    finally:
        asyncio.run(throttled.close())


def test_a_bearer_key_claim_is_settled_before_the_body(gateway: Gateway, store: Store) -> None:
    _, key = asyncio.run(create_key(store, "eng", None, None))
    request = arrived(sign(("PCAKAAAAAAAAAAAAAAAA", "s" * 40)), headers={"authorization": f"Bearer {key}"})
    claim = asyncio.run(gateway.auth.claim(request))
    assert isinstance(claim, Claim) and claim.principal is not None and claim.signature is None


def test_api_key_endpoints_name_what_they_take_when_sent_a_signature(gateway: Gateway, credential: tuple[str, str]) -> None:
    request = arrived(sign(credential))
    with pytest.raises(GatewayError) as caught:
        asyncio.run(gateway.auth.authenticate(request.headers, "10.1.2.3"))
    assert caught.value.kind is ErrorKind.AUTHENTICATION and "SigV4" in caught.value.message


# --- the issued pair and its seal -------------------------------------------------------


def test_an_issued_pair_looks_like_aws_credentials(credential: tuple[str, str]) -> None:
    access_key_id, secret = credential
    assert is_access_key_id(access_key_id) and len(access_key_id) == 20 and access_key_id.isupper()
    assert len(secret) == 40
    base64.b32decode(access_key_id[4:])


def test_a_sealed_secret_opens_only_for_its_own_credential(store: Store, credential: tuple[str, str]) -> None:
    from portcullis.adapters.aws_credentials import SealError

    other, _ = asyncio.run(create_aws_credential(store, SEAL, "eng", "mallory", None))
    record, sealed = asyncio.run(store.keys.find_aws_credential(credential[0]))  # type: ignore[misc]
    assert SEAL.unseal(record, sealed) == credential[1]
    assert credential[1].encode() not in sealed.blob
    with pytest.raises(SealError):
        SEAL.unseal(other, sealed)  # a secret moved onto another row does not open
    with pytest.raises(SealError):
        SealKeys([bytes(32)]).unseal(record, sealed)  # nor under a key that did not seal it


def test_a_credential_found_once_is_cached_for_key_cache_seconds(store: Store, credential: tuple[str, str]) -> None:
    now = [0.0]
    gateway = Gateway(store, SEAL)
    gateway.auth = Authenticator(store, 5, clock=lambda: now[0], seal=SEAL)
    assert gateway.check(arrived(sign(credential, body=b'{"n":1}'))).key_id == credential[0]
    asyncio.run(store.keys.revoke_key(credential[0], dt.datetime.now(dt.UTC)))
    assert gateway.check(arrived(sign(credential, body=b'{"n":2}'))).key_id == credential[0]  # within the cache
    refused(gateway, arrived(sign((credential[0], "w" * 40), body=b'{"n":3}')), "invalid_signature", "InvalidSignatureException")  # still verified
    now[0] = 6.0
    refused(gateway, arrived(sign(credential, body=b'{"n":4}')), "revoked_access_key", "UnrecognizedClientException")
