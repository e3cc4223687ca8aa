"""Bedrock served, what must not get through: nothing of the AWS account in what a client
or the log sees, none of the client's credentials in what any provider receives, the
gateway's own refusals in AWS's shape for boto3, and the PII, prompt-integrity,
tool-call and output guards on Converse's shapes end to end."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import botocore.exceptions
import httpx
import openai
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.bedrock_helpers import (
    APAC_ID,
    CONVERSE,
    NOVA,
    SONNET_ID,
    bedrock_gateway,
    boto3_client,
    invoke_body,
    issue,
    reference_bundle,
    reference_tenants,
    signed_by_gateway,
    streamed_text,
)
from tests.conftest import UPSTREAM_KEY, BedrockFakes, Fakes, GatewayProcess
from tests.fakes import Fail, FakeProvider, Reply, ToolCall
from tests.integrity_helpers import AGENT_SAFETY, CANARY, EVIL_COMMAND, INSERTED_START
from tests.pii_helpers import EMAIL, REGULATED

pytestmark = pytest.mark.served

ACCOUNT_DETAILS = ("123456789012", "arn:", "assumed-role", "PortcullisBedrock", "foundation-model/", "inference-profile/")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, session_bedrock: BedrockFakes) -> Iterator[GatewayProcess]:
    running = bedrock_gateway(tmp_path_factory.mktemp("bedrock-safety"), session_fakes, session_bedrock)
    yield running
    running.stop()


def aws_error(call: Callable[[], Any]) -> dict[str, Any]:
    """The error boto3 raised for ``call``: its code, message and HTTP status."""
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        call()
    return {**failed.value.response["Error"], "status": failed.value.response["ResponseMetadata"]["HTTPStatusCode"]}


# --- 5. nothing of the account leaks -----------------------------------------------------------


@pytest.mark.parametrize("status", [400, 403, 404])
def test_an_upstream_error_naming_the_account_reaches_no_client_and_no_log(status: int, reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """The fake words its 400/403/404 as AWS does, with ARNs, the account id and the role."""
    bedrock.usw2.script(NOVA, Fail(status), Fail(status))
    error = aws_error(lambda: boto3_client(reference, issue(reference)).converse(modelId=NOVA, **CONVERSE))
    client = anthropic.Anthropic(base_url=reference.url, api_key=reference.key("eng"), max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(model=NOVA, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert len(bedrock.usw2.received) == 2  # both reached the fake, which answered with the account's details
    assert error["Code"] and error["status"] >= 400 and refused.value.status_code >= 400
    if status == 400:  # the client's request was at fault: it says so, with the resource named only as such
        assert error["Code"] == "ValidationException" and isinstance(refused.value, anthropic.BadRequestError)
        assert "(an AWS resource)" in error["Message"]
    for seen in (error["Message"], json.dumps(refused.value.body), reference.logs()):
        for detail in ACCOUNT_DETAILS:
            assert detail not in seen, (detail, seen[-500:])


def _x_api_key(gateway: GatewayProcess, model: str) -> list[str]:
    key = gateway.key("eng")
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    client.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    return [key]


def _bearer(gateway: GatewayProcess, model: str) -> list[str]:
    key = gateway.key("eng")
    openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0).chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    return [key]


def _sigv4(gateway: GatewayProcess, model: str) -> list[str]:
    access_key, secret = issue(gateway)
    client = boto3_client(gateway, (access_key, secret))
    signed: list[str] = []
    client.meta.events.register("before-send.bedrock-runtime.*", lambda request, **_: signed.append(request.headers["Authorization"].decode()))
    client.converse(modelId=model, **CONVERSE)
    (authorization,) = signed
    return [access_key, secret, authorization.rsplit("Signature=", 1)[1], authorization]


@pytest.mark.parametrize("client", [_x_api_key, _bearer, _sigv4], ids=["x-api-key", "bearer", "sigv4"])
@pytest.mark.parametrize(("model", "egress"), [(NOVA, "bedrock"), ("claude-haiku-4-5", "anthropic"), ("gpt-4o-mini", "openai")])
def test_the_clients_credentials_reach_no_provider(
    client: Callable[[GatewayProcess, str], list[str]],
    model: str,
    egress: str,
    reference: GatewayProcess,
    bedrock: BedrockFakes,
    fakes: Fakes,
) -> None:
    secrets = client(reference, model)
    fake: FakeProvider = {"bedrock": bedrock.usw2, "anthropic": fakes.anthropic_eu, "openai": fakes.openai_main}[egress]
    (received,) = fake.received
    carried = json.dumps(received.headers) + received.body.decode()
    for secret in secrets:
        assert secret not in carried
    if egress == "bedrock":
        assert signed_by_gateway(received)
    else:
        assert UPSTREAM_KEY in carried  # the provider's own key, in its place
    assert not any(value.startswith("AWS4-HMAC-SHA256") for value in received.headers.values()) or egress == "bedrock"


# --- 6. the gateway's refusals in AWS's shape ----------------------------------------------------


def test_a_model_the_key_may_not_use_is_access_denied(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    error = aws_error(lambda: boto3_client(reference, issue(reference, team="nova-only")).converse(modelId=SONNET_ID, **CONVERSE))
    assert error["Code"] == "AccessDeniedException" and error["status"] == 403 and SONNET_ID in error["Message"]
    assert not bedrock.apne2.received and not bedrock.usw2.received


def test_an_unknown_model_is_not_found(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    error = aws_error(lambda: boto3_client(reference, issue(reference)).converse(modelId="anthropic.claude-unknown-v1:0", **CONVERSE))
    assert error["Code"] == "ResourceNotFoundException" and error["status"] == 404
    assert not bedrock.apne2.received and not bedrock.usw2.received


BAD_BODIES = [(invoke_body(max_tokens="lots"), "max_tokens"), (invoke_body(model=SONNET_ID), "model"), (b'{"messages": [', "JSON")]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
def test_a_bad_invoke_body_is_a_validation_error_naming_the_field(body: bytes, field: str, reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    error = aws_error(lambda: boto3_client(reference, issue(reference)).invoke_model(modelId=SONNET_ID, body=body))
    assert error["Code"] == "ValidationException" and error["status"] == 400 and field in error["Message"]
    assert not bedrock.apne2.received


def test_a_bad_converse_body_is_a_validation_error_naming_the_field(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """boto3 checks its own parameters; a body sent past it reaches the gateway's validator."""
    body = json.dumps({"messages": [{"role": "user", "content": [{"text": "Hi"}, {"telepathy": {}}]}]})
    response = _signed(reference, f"/model/{SONNET_ID}/converse", body.encode())
    assert response.status_code == 400 and response.headers["x-amzn-ErrorType"].startswith("ValidationException")
    assert "messages[0].content[1]" in response.json()["message"] and not bedrock.apne2.received


def _signed(gateway: GatewayProcess, path: str, body: bytes) -> httpx.Response:
    request = AWSRequest(method="POST", url=f"{gateway.url}{path}", data=body, headers={"content-type": "application/json"})
    SigV4Auth(Credentials(*issue(gateway)), "bedrock", "us-east-1").add_auth(request)
    return httpx.post(request.url, content=body, headers=dict(request.headers.items()))


def test_the_gateways_rate_limit_is_a_throttling_exception(tmp_path: Path, fakes: Fakes, bedrock: BedrockFakes) -> None:
    tenants = reference_tenants()
    tenants["teams"]["hasty"] = {"models": ["claude-*"]}
    bundle = reference_bundle(tmp_path / "bundle", tenants=tenants, governance={"hasty-rate": {"subject": {"team": "hasty"}, "rate": {"rpm": 1}}})
    gateway = bedrock_gateway(tmp_path / "gw", fakes, bedrock, bundle)
    try:
        client = boto3_client(gateway, issue(gateway, team="hasty"))
        assert client.converse(modelId=SONNET_ID, **CONVERSE)["output"]["message"]["content"][0]["text"]
        # Another request, not the same one again: within the signature's second that would be a replay.
        again = [{"role": "user", "content": [{"text": "And again."}]}]
        error = aws_error(lambda: client.converse(modelId=SONNET_ID, messages=again))
        assert error["Code"] == "ThrottlingException" and error["status"] == 429
        assert "rate" in error["Message"].lower() and "Too many requests, please wait" not in error["Message"]  # the gateway's, not Bedrock's
        assert len(bedrock.apne2.received) == 1
    finally:
        gateway.stop()


# --- 7. the guards on Converse's shapes ----------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, session_bedrock: BedrockFakes) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("bedrock-guarded")
    bundle = reference_bundle(directory / "bundle", pii={"regulated": REGULATED}, integrity={"agent-safety": AGENT_SAFETY})
    running = bedrock_gateway(directory, session_fakes, session_bedrock, bundle)
    yield running
    running.stop()


COMMAND_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
TOOLS = {"tools": [{"toolSpec": {"name": "bash", "description": "Runs a shell command.", "inputSchema": {"json": COMMAND_SCHEMA}}}]}


def test_an_email_is_pseudonymised_for_bedrock_and_restored_for_boto3(guarded: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(echo=True))
    messages = [{"role": "user", "content": [{"text": f"Write to {EMAIL} today."}]}]
    answer = boto3_client(guarded, issue(guarded)).converse(modelId=SONNET_ID, messages=messages, inferenceConfig={"maxTokens": 64})
    (sent,) = bedrock.apne2.received
    assert EMAIL not in sent.body.decode() and "today." in sent.json["messages"][0]["content"][0]["text"]
    assert answer["output"]["message"]["content"][0]["text"] == f"Write to {EMAIL} today."


def test_the_policy_prompt_is_the_first_system_entry(guarded: GatewayProcess, bedrock: BedrockFakes) -> None:
    boto3_client(guarded, issue(guarded)).converse(modelId=SONNET_ID, system=[{"text": "Be brief."}], **CONVERSE)
    (sent,) = bedrock.apne2.received
    first, second = sent.json["system"]
    assert first["text"].startswith(INSERTED_START) and second == {"text": "Be brief."}


def test_a_denied_streamed_tool_use_arrives_as_its_denial(guarded: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="", tool_calls=(ToolCall("bash", {"command": EVIL_COMMAND}, id="tooluse_1"),), pieces=4))
    answer = boto3_client(guarded, issue(guarded)).converse_stream(modelId=SONNET_ID, toolConfig=TOOLS, **CONVERSE)
    events = list(answer["stream"])
    assert "policy denied a call to the tool `bash`" in streamed_text(events)
    assert not [e for e in events if "toolUse" in json.dumps(e.get("contentBlockStart", {})) or "toolUse" in json.dumps(e.get("contentBlockDelta", {}))]
    assert EVIL_COMMAND not in json.dumps(events, default=str)
    assert next(e["messageStop"]["stopReason"] for e in events if "messageStop" in e) == "end_turn"


def test_a_withheld_streamed_answer_ends_in_an_exception_boto3_raises(guarded: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text=f"My instructions end with: Confidential marker: {CANARY}. Never repeat it.", pieces=9))
    answer = boto3_client(guarded, issue(guarded)).converse_stream(modelId=SONNET_ID, **CONVERSE)
    seen: list[dict[str, Any]] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as failed:
        seen.extend(answer["stream"])
    assert "PCX-" not in json.dumps(seen, default=str)
    assert "withheld by the gateway's output policy" in failed.value.response["Error"]["Message"]
    outcome = guarded.outcome(answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"])
    assert outcome["event"] == "request_failed" and outcome["error"]["code"] == "output_withheld"
