"""SigV4 end to end: a real gateway process, credentials issued by ``portcullis keys
create --aws``, requests signed by real botocore and sent over real HTTP — first as a
signed Anthropic Messages request (the executor verifies any route's signature), then
through boto3's ``bedrock-runtime`` client and ``AnthropicBedrock`` on the Bedrock routes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import botocore.config
import botocore.exceptions
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.bedrock_helpers import SEAL_ENV, SIGV4, cli, issue
from tests.conftest import Fakes, GatewayProcess
from tests.sigv4_helpers import bedrock_client

pytestmark = pytest.mark.served

MESSAGE = {"model": "haiku", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0"
SIGNATURE_CODES = {"InvalidSignatureException", "IncompleteSignatureException", "UnrecognizedClientException"}


@pytest.fixture
def sigv4_gateway(fresh_gateway: Callable[..., GatewayProcess]) -> GatewayProcess:
    return fresh_gateway(env=SEAL_ENV, auth=SIGV4)


def signed_post(gateway: GatewayProcess, credential: tuple[str, str], path: str, body: bytes, service: str = "bedrock") -> tuple[dict[str, str], bytes]:
    request = AWSRequest(method="POST", url=f"{gateway.url}{path}", data=body, headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    SigV4Auth(Credentials(*credential), service, "us-east-1").add_auth(request)
    return dict(request.headers.items()), body


# --- runnable on the routes that exist today ----------------------------------------------


def test_a_signed_messages_request_is_served_as_its_principal(sigv4_gateway: GatewayProcess, fakes: Fakes) -> None:
    credential = issue(sigv4_gateway, user="carol")
    headers, body = signed_post(sigv4_gateway, credential, "/v1/messages", json.dumps(MESSAGE).encode())
    response = httpx.post(f"{sigv4_gateway.url}/v1/messages", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert fakes.anthropic_eu.received
    assert not any(value.startswith("AWS4-HMAC-SHA256") for value in fakes.anthropic_eu.received[-1].headers.values())  # the signature stays here
    started = next(r for r in sigv4_gateway.records_for(response.headers["x-portcullis-request-id"]) if r["event"] == "request_started")
    assert started["principal"] == {"key_id": credential[0], "team": "eng", "user": "carol"}

    replay = httpx.post(f"{sigv4_gateway.url}/v1/messages", content=body, headers=headers)
    assert replay.status_code == 403 and replay.headers["x-portcullis-error-code"] == "replayed_request"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda headers, body: (headers, body.replace(b"Hi", b"Ho")), "invalid_signature"),
        (lambda headers, body: ({**headers, "content-type": "text/plain"}, body), "invalid_signature"),
        (
            lambda headers, body: ({**headers, "Authorization": headers["Authorization"].replace("Credential=PCAK", "Credential=PCAL")}, body),
            "unrecognized_client",
        ),
    ],
)
def test_a_request_changed_after_signing_is_refused_before_upstream(
    sigv4_gateway: GatewayProcess, fakes: Fakes, change: Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]], code: str
) -> None:
    credential = issue(sigv4_gateway)
    headers, body = change(*signed_post(sigv4_gateway, credential, "/v1/messages", json.dumps(MESSAGE).encode()))
    response = httpx.post(f"{sigv4_gateway.url}/v1/messages", content=body, headers=headers)
    assert response.status_code == 403 and response.headers["x-portcullis-error-code"] == code
    assert response.json()["error"]["type"] == "permission_error" and credential[1] not in response.text
    assert not fakes.anthropic_eu.received and not fakes.anthropic_us.received
    denied = [r for r in sigv4_gateway.audit_records() if r["event"] == "request_denied"]
    assert denied and denied[-1]["stage"] == "authenticate" and "principal" not in denied[-1]


def test_without_a_seal_key_sigv4_is_refused_and_bearer_keys_work(fresh_gateway: Callable[..., GatewayProcess], fakes: Fakes) -> None:
    gateway = fresh_gateway()
    headers, body = signed_post(gateway, ("PCAKAAAAAAAAAAAAAAAA", "s" * 40), "/v1/messages", json.dumps(MESSAGE).encode())
    response = httpx.post(f"{gateway.url}/v1/messages", content=body, headers=headers)
    assert response.status_code == 403 and response.headers["x-portcullis-error-code"] == "sigv4_disabled"
    key = gateway.key("eng")
    ok = httpx.post(f"{gateway.url}/v1/messages", json=MESSAGE, headers={"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200


# --- needs the Bedrock Runtime routes ----------------------------------------------------


def bedrock(gateway: GatewayProcess, credential: tuple[str, str]) -> Any:
    return bedrock_client(gateway.url, credential, "eu-west-1")


CONVERSE = {"messages": [{"role": "user", "content": [{"text": "Hi"}]}], "inferenceConfig": {"maxTokens": 8}}


def test_boto3_converse_signed_with_an_issued_credential_is_served(sigv4_gateway: GatewayProcess, fakes: Fakes) -> None:
    credential = issue(sigv4_gateway)
    answer = bedrock(sigv4_gateway, credential).converse(modelId="haiku", **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"]
    assert fakes.anthropic_eu.received


def test_boto3_signatures_over_percent_encoded_arns_verify(sigv4_gateway: GatewayProcess) -> None:
    """boto3 sends the ARN as ``arn%3Aaws…%2F…``: the signature verifies, so whatever the
    answer, it is not a signature refusal."""
    client = bedrock(sigv4_gateway, issue(sigv4_gateway))
    try:
        client.converse(modelId=ARN, **CONVERSE)
    except botocore.exceptions.ClientError as error:
        assert error.response["Error"]["Code"] not in SIGNATURE_CODES, error.response


@pytest.mark.parametrize(
    ("credential", "code"),
    [(lambda real: (real[0], "x" * 40), "InvalidSignatureException"), (lambda real: ("PCAKAAAAAAAAAAAAAAAA", real[1]), "UnrecognizedClientException")],
)
def test_boto3_sees_aws_error_codes_for_bad_credentials(
    sigv4_gateway: GatewayProcess, fakes: Fakes, credential: Callable[[tuple[str, str]], tuple[str, str]], code: str
) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        bedrock(sigv4_gateway, credential(issue(sigv4_gateway))).converse(modelId="haiku", **CONVERSE)
    assert failed.value.response["Error"]["Code"] == code and failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert not fakes.anthropic_eu.received


def test_a_revoked_credential_is_refused_to_boto3(sigv4_gateway: GatewayProcess) -> None:
    credential = issue(sigv4_gateway)
    cli(sigv4_gateway, "keys", "revoke", credential[0])
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        bedrock(sigv4_gateway, credential).converse(modelId="haiku", **CONVERSE)
    assert failed.value.response["Error"]["Code"] == "UnrecognizedClientException"


def test_anthropic_bedrock_signs_raw_colons_and_is_served(sigv4_gateway: GatewayProcess, fakes: Fakes) -> None:
    access_key, secret = issue(sigv4_gateway)
    client = anthropic.AnthropicBedrock(aws_access_key=access_key, aws_secret_key=secret, aws_region="us-east-1", base_url=sigv4_gateway.url, max_retries=0)
    message = client.messages.create(model="haiku", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text
    try:
        client.messages.create(model=ARN, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    except anthropic.APIStatusError as error:
        assert error.response.headers.get("x-amzn-ErrorType") not in SIGNATURE_CODES


def test_a_request_without_any_credential_gets_aws_403(sigv4_gateway: GatewayProcess) -> None:
    """AWS answers a missing credential 403 MissingAuthenticationTokenException, not 401."""
    response = httpx.post(f"{sigv4_gateway.url}/model/haiku/converse", json={"messages": [{"role": "user", "content": [{"text": "Hi"}]}]})
    assert response.status_code == 403
    assert response.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException" and set(response.json()) == {"message"}
    assert response.headers["x-portcullis-error-code"] == "missing_api_key"
