"""Bedrock in and out, served: real boto3 ``bedrock-runtime`` and ``AnthropicBedrock``
clients signing with credentials from ``portcullis keys create --aws``, and Messages and
Chat clients, through a real gateway process to fake Bedrock Runtimes that verify the
gateway's own SigV4 — on the reference routing (Claude on Bedrock in ap-northeast-2,
then us-west-2, then Anthropic direct), with failover before the first byte and none
after, nothing of the AWS account or the client's credentials passed on, and errors in
AWS's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anthropic
import boto3
import botocore.config
import botocore.exceptions
import openai
import pytest

from tests.bedrock_helpers import (
    APAC_ID,
    CANONICAL,
    CONVERSE,
    DIRECT,
    NOVA,
    SONNET_ARN,
    SONNET_ID,
    anthropic_bedrock,
    bedrock_gateway,
    boto3_client,
    invoke_body,
    invoke_chunks,
    issue,
    operations,
    self_signed,
    signed_by_gateway,
    streamed_text,
)
from tests.conftest import BedrockFakes, Fakes, GatewayProcess
from tests.fakes import CutStream, Fail, Reply

pytestmark = pytest.mark.served

SEOUL = f"/model/{quote(APAC_ID, safe='')}"  # the apac. profile, percent-encoded
BEDROCK_VERSION = "bedrock-2023-05-31"
NO_RETRIES = botocore.config.Config(retries={"total_max_attempts": 1}, read_timeout=15)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, session_bedrock: BedrockFakes) -> Iterator[GatewayProcess]:
    # Four attempts: the whole route, then the fallback model.
    running = bedrock_gateway(tmp_path_factory.mktemp("bedrock"), session_fakes, session_bedrock, limits={"max_attempts": 4})
    yield running
    running.stop()


def request_id(answer: dict[str, Any]) -> str:
    return answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"]


# --- 1. boto3 and AnthropicBedrock, SigV4 ----------------------------------------------------


def test_boto3_converse_is_served_by_the_first_bedrock_region(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="Hello from Seoul."))
    answer = boto3_client(reference, issue(reference)).converse(modelId=SONNET_ID, system=[{"text": "Be brief."}], **CONVERSE)
    assert answer["output"]["message"]["content"] == [{"text": "Hello from Seoul."}] and answer["stopReason"] == "end_turn"
    assert answer["usage"]["inputTokens"] == 100 and answer["usage"]["outputTokens"] == 20
    (sent,) = bedrock.apne2.received
    assert sent.path == f"{SEOUL}/converse" and sent.model == APAC_ID and signed_by_gateway(sent)
    assert sent.json["system"] == [{"text": "Be brief."}] and sent.json["messages"] == CONVERSE["messages"] and "modelId" not in sent.json
    assert not bedrock.usw2.received
    outcome = reference.outcome(request_id(answer))
    assert outcome["event"] == "request_finished" and outcome["served"]["provider"] == "bedrock-apne2" and outcome["served"]["model"] == APAC_ID
    assert [a["outcome"] for a in outcome["attempts"]] == ["ok"] and outcome["cost_micro_usd"] == 600  # 100 × 3 + 20 × 15 micro-USD


def test_boto3_converse_stream_arrives_as_boto3_reads_it(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="Streamed from Seoul.", pieces=4))
    answer = boto3_client(reference, issue(reference)).converse_stream(modelId=SONNET_ID, **CONVERSE)
    events = list(answer["stream"])
    assert streamed_text(events) == "Streamed from Seoul."
    assert list(events[0]) == ["messageStart"] and events[-2]["messageStop"]["stopReason"] == "end_turn"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 20
    (sent,) = bedrock.apne2.received
    assert sent.path == f"{SEOUL}/converse-stream" and signed_by_gateway(sent)
    outcome = reference.outcome(request_id(answer))
    assert outcome["event"] == "request_finished" and outcome["usage"]["complete"] is True and outcome["usage"]["output"] == 20


def test_boto3_invoke_model_goes_to_invoke_model(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="Invoked."))
    answer = boto3_client(reference, issue(reference)).invoke_model(modelId=SONNET_ID, body=invoke_body(), contentType="application/json")
    message = json.loads(answer["body"].read())
    assert message["type"] == "message" and message["content"] == [{"type": "text", "text": "Invoked."}]
    (sent,) = bedrock.apne2.received
    assert sent.path == f"{SEOUL}/invoke" and signed_by_gateway(sent)
    assert sent.json["anthropic_version"] == "bedrock-2023-05-31" and "model" not in sent.json and "stream" not in sent.json
    assert reference.outcome(request_id(answer))["served"]["provider"] == "bedrock-apne2"


def test_boto3_invoke_model_with_response_stream(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="Invoked in chunks.", pieces=3))
    answer = boto3_client(reference, issue(reference)).invoke_model_with_response_stream(modelId=SONNET_ID, body=invoke_body())
    chunks = invoke_chunks(answer["body"])
    assert chunks[0]["type"] == "message_start" and chunks[-1]["type"] == "message_stop"
    assert "".join(c["delta"].get("text", "") for c in chunks if c["type"] == "content_block_delta") == "Invoked in chunks."
    (sent,) = bedrock.apne2.received
    assert sent.path == f"{SEOUL}/invoke-with-response-stream" and "stream" not in sent.json
    outcome = reference.outcome(request_id(answer))
    assert outcome["event"] == "request_finished" and outcome["usage"]["complete"] is True


def test_an_arn_the_catalog_aliases_is_served(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    answer = boto3_client(reference, issue(reference)).converse(modelId=SONNET_ARN, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "Hello from the fake provider."
    (sent,) = bedrock.apne2.received
    assert sent.path == f"{SEOUL}/converse"  # the catalog's target, not the ARN the client named
    started = next(r for r in reference.records_for(request_id(answer)) if r["event"] == "request_started")
    assert started["requested_model"] == SONNET_ARN and started["model"] == CANONICAL and started["protocol"] == "bedrock_converse"


def test_anthropic_bedrock_create_and_stream_with_raw_colons(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """AnthropicBedrock sends the model id with raw colons; it goes upstream encoded. The
    body names Bedrock's documented version (see the next test for the SDK's default)."""
    bedrock.apne2.script(APAC_ID, Reply(text="Created."), Reply(text="Streamed.", pieces=3))
    client = anthropic_bedrock(reference, issue(reference))
    request: Any = {"model": SONNET_ID, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], "extra_body": {"anthropic_version": BEDROCK_VERSION}}
    created = client.messages.with_raw_response.create(**request)
    assert created.parse().content[0].text == "Created."
    with client.messages.stream(**request) as events:
        assert "".join(events.text_stream) == "Streamed."
    assert operations(bedrock.apne2) == ["invoke", "invoke-with-response-stream"]
    assert all(r.path.startswith(SEOUL) and r.model == APAC_ID and signed_by_gateway(r) for r in bedrock.apne2.received)
    assert [r.json["anthropic_version"] for r in bedrock.apne2.received] == [BEDROCK_VERSION] * 2
    assert reference.outcome(created.headers["x-portcullis-request-id"])["served"]["provider"] == "bedrock-apne2"


def test_anthropic_bedrock_with_its_default_version_is_served_by_bedrock(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """AnthropicBedrock 2.x sends its dated API version as anthropic_version; Bedrock takes only its own."""
    client = anthropic_bedrock(reference, issue(reference))
    message = client.messages.create(model=SONNET_ID, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text == "Hello from the fake provider."
    assert operations(bedrock.apne2) == ["invoke"]
    assert bedrock.apne2.received[0].json["anthropic_version"] == BEDROCK_VERSION


# --- 2. Bearer keys, over HTTPS ------------------------------------------------------------


def test_boto3_with_a_bearer_token_over_https(
    tmp_path: Path,
    fakes: Fakes,
    bedrock: BedrockFakes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """boto3 sends ``AWS_BEARER_TOKEN_BEDROCK`` as a Bearer token, and only over HTTPS."""
    cert_file, key_file = self_signed(tmp_path)
    gateway = bedrock_gateway(tmp_path / "gw", fakes, bedrock, listen={"tls": {"cert_file": str(cert_file), "key_file": str(key_file)}})
    try:
        assert gateway.url.startswith("https://")
        key = gateway.key("eng")
        monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", key)
        with pytest.raises(botocore.exceptions.InvalidEndpointConfigurationError, match="HTTPS"):  # why the gateway serves TLS
            boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{gateway.port}", config=NO_RETRIES).converse(
                modelId=SONNET_ID, **CONVERSE
            )
        client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=gateway.url, verify=str(cert_file), config=NO_RETRIES)
        sent_as: list[str] = []
        client.meta.events.register("before-send.bedrock-runtime.*", lambda request, **_: sent_as.append(request.headers["Authorization"].decode()))
        answer = client.converse(modelId=SONNET_ID, **CONVERSE)
        assert answer["output"]["message"]["content"][0]["text"] == "Hello from the fake provider."
        events = list(client.converse_stream(modelId=SONNET_ID, **CONVERSE)["stream"])
        assert streamed_text(events) == "Hello from the fake provider."
        assert sent_as == [f"Bearer {key}"] * 2 and operations(bedrock.apne2) == ["converse", "converse-stream"]
        for sent in bedrock.apne2.received:
            assert signed_by_gateway(sent) and key not in json.dumps(sent.headers)
        started = next(r for r in gateway.records_for(request_id(answer)) if r["event"] == "request_started")
        assert started["principal"]["team"] == "eng" and not started["principal"]["key_id"].startswith("PCAK")
    finally:
        gateway.stop()


# --- 3. Messages and Chat clients served by Bedrock ------------------------------------------


def test_a_messages_client_is_served_by_invoke_model_near_passthrough(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="Plain."), Reply(text="Streamed.", pieces=3))
    client = anthropic.Anthropic(base_url=reference.url, api_key=reference.key("eng"), max_retries=0)
    system: Any = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    request: Any = {"model": CANONICAL, "max_tokens": 64, "system": system, "messages": [{"role": "user", "content": "Hi"}]}
    created = client.messages.with_raw_response.create(**request)
    assert created.parse().content[0].text == "Plain." and created.parse().usage.output_tokens == 20
    with client.messages.stream(**request) as events:
        assert "".join(events.text_stream) == "Streamed."
        assert events.get_final_message().stop_reason == "end_turn"
    assert operations(bedrock.apne2) == ["invoke", "invoke-with-response-stream"]
    for sent in bedrock.apne2.received:
        assert sent.json["anthropic_version"] == BEDROCK_VERSION and "model" not in sent.json and "stream" not in sent.json
        # The client's members in the client's order (the SDK's: model taken out), cache_control kept.
        assert sent.json["system"] == system and list(sent.json) == ["anthropic_version", "max_tokens", "messages", "system"]
    outcome = reference.outcome(created.headers["x-portcullis-request-id"])
    assert outcome["served"]["provider"] == "bedrock-apne2" and outcome["cost_micro_usd"] == 600
    assert "x-portcullis-model-fallback" not in created.headers


def test_a_chat_client_is_served_by_converse(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """A Chat body is not a Messages body: it goes to the Bedrock target through Converse."""
    bedrock.apne2.script(APAC_ID, Reply(text="Chat plain."), Reply(text="Chat streamed.", pieces=3))
    client = openai.OpenAI(base_url=f"{reference.url}/v1", api_key=reference.key("eng"), max_retries=0)
    messages: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    created = client.chat.completions.with_raw_response.create(model=CANONICAL, messages=messages, max_tokens=64)
    assert created.parse().choices[0].message.content == "Chat plain." and created.parse().usage.completion_tokens == 20
    chunks = client.chat.completions.create(model=CANONICAL, messages=messages, max_tokens=64, stream=True, stream_options={"include_usage": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Chat streamed."
    assert operations(bedrock.apne2) == ["converse", "converse-stream"]
    first = bedrock.apne2.received[0].json
    assert first["system"] == [{"text": "Be brief."}] and first["messages"] == [{"role": "user", "content": [{"text": "Hi"}]}]
    assert first["inferenceConfig"]["maxTokens"] == 64
    assert reference.outcome(created.headers["x-portcullis-request-id"])["served"]["provider"] == "bedrock-apne2"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_messages_client_is_served_by_a_converse_only_model(stream: bool, reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.usw2.script(NOVA, Reply(text="Nova speaks.", pieces=3))
    client = anthropic.Anthropic(base_url=reference.url, api_key=reference.key("eng"), max_retries=0)
    request: Any = {"model": NOVA, "max_tokens": 64, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        with client.messages.stream(**request) as events:
            assert "".join(events.text_stream) == "Nova speaks."
    else:
        assert client.messages.create(**request).content[0].text == "Nova speaks."
    (sent,) = bedrock.usw2.received
    assert sent.path == f"/model/{quote(NOVA, safe='')}/{'converse-stream' if stream else 'converse'}" and signed_by_gateway(sent)
    assert sent.json["system"] == [{"text": "Be brief."}] and sent.json["messages"] == [{"role": "user", "content": [{"text": "Hi"}]}]
    assert not bedrock.apne2.received


# --- 4. failover on the reference routing ------------------------------------------------------


def test_a_throttled_region_fails_over_to_the_next(reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Fail(429))
    bedrock.usw2.script(SONNET_ID, Reply(text="Hello from Oregon."))
    answer = boto3_client(reference, issue(reference)).converse(modelId=SONNET_ID, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "Hello from Oregon."
    assert operations(bedrock.apne2) == ["converse"] and operations(bedrock.usw2) == ["converse"]
    assert bedrock.apne2.received[0].body == bedrock.usw2.received[0].body  # the same request, signed for another region
    assert "x-portcullis-model-fallback" not in answer["ResponseMetadata"]["HTTPHeaders"]  # the same canonical model
    outcome = reference.outcome(request_id(answer))
    assert [(a["provider"], a["status"]) for a in outcome["attempts"]] == [("bedrock-apne2", 429), ("bedrock-usw2", 200)]
    assert outcome["event"] == "request_finished" and outcome["served"]["region"] == "us-west-2"


def test_both_regions_failing_falls_back_to_anthropic_direct(reference: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    bedrock.apne2.script(APAC_ID, Fail(500))
    bedrock.usw2.script(SONNET_ID, Fail(503))
    fakes.anthropic_us.script(DIRECT, Reply(text="Hello from Anthropic.", pieces=3))
    client = anthropic.Anthropic(base_url=reference.url, api_key=reference.key("eng"), max_retries=0)
    with client.messages.stream(model=CANONICAL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as events:
        assert "".join(events.text_stream) == "Hello from Anthropic."
        request = events.response.headers["x-portcullis-request-id"]
        assert "x-portcullis-model-fallback" not in events.response.headers
    assert operations(bedrock.apne2) == ["invoke-with-response-stream"] and operations(bedrock.usw2) == ["invoke-with-response-stream"]
    (direct,) = fakes.anthropic_us.received
    assert direct.path == "/v1/messages" and direct.json["model"] == DIRECT and direct.json["stream"] is True and "anthropic_version" not in direct.json
    outcome = reference.outcome(request)
    assert [(a["provider"], a["status"]) for a in outcome["attempts"]] == [("bedrock-apne2", 500), ("bedrock-usw2", 503), ("anthropic-us", 200)]
    assert outcome["served"]["provider"] == "anthropic-us"


def test_the_fallback_header_says_when_another_model_served(reference: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    for fake, model in ((bedrock.apne2, APAC_ID), (bedrock.usw2, SONNET_ID), (fakes.anthropic_us, DIRECT)):
        fake.script(model, Fail(503))
    answer = boto3_client(reference, issue(reference)).converse(modelId=SONNET_ID, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "Hello from the fake provider."
    assert answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-model-fallback"] == CANONICAL  # names the model asked for
    assert [r.path for r in fakes.anthropic_eu.received] == ["/v1/messages"]
    assert reference.outcome(request_id(answer))["served"]["canonical_model"] == "claude-haiku-4-5"


def _converse_events(client: Any) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    answer = client.converse_stream(modelId=SONNET_ID, **CONVERSE)
    return answer, iter(answer["stream"])


def _invoke_events(client: Any) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    answer = client.invoke_model_with_response_stream(modelId=SONNET_ID, body=invoke_body())
    return answer, (json.loads(event["chunk"]["bytes"]) for event in answer["body"])


@pytest.mark.parametrize(("start", "first"), [(_converse_events, "messageStart"), (_invoke_events, "message_start")], ids=["converse", "invoke"])
def test_a_boto3_stream_cut_after_its_first_byte_is_not_failed_over(start: Any, first: str, reference: GatewayProcess, bedrock: BedrockFakes) -> None:
    """Once bytes reached the client, another region would answer twice: the stream ends
    in an exception frame boto3 raises, and only Seoul was asked."""
    bedrock.apne2.script(APAC_ID, CutStream(after=3))
    answer, events = start(boto3_client(reference, issue(reference)))
    seen: list[dict[str, Any]] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as failed:
        seen.extend(events)
    assert first in json.dumps(seen[0]) and not any("messageStop" in e or e.get("type") == "message_stop" for e in seen)  # started, never stopped
    assert failed.value.response["Error"]["Code"] == "modelStreamErrorException" and failed.value.response["Error"]["Message"]
    assert not bedrock.usw2.received
    outcome = reference.outcome(request_id(answer))
    assert outcome["event"] == "request_failed" and [a["provider"] for a in outcome["attempts"]] == ["bedrock-apne2"]


def test_a_messages_stream_cut_after_its_first_byte_ends_in_an_sdk_error(reference: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    bedrock.apne2.script(APAC_ID, CutStream(after=3))
    client = anthropic.Anthropic(base_url=reference.url, api_key=reference.key("eng"), max_retries=0)
    request: Any = {"model": CANONICAL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(anthropic.APIStatusError) as failed, client.messages.stream(**request) as events:
        request = events.response.headers["x-portcullis-request-id"]
        list(events.text_stream)
    assert failed.value.body["error"]["type"] in ("api_error", "overloaded_error")  # type: ignore[index]
    assert not bedrock.usw2.received and not fakes.anthropic_us.received
    outcome = reference.outcome(request)
    assert outcome["event"] == "request_failed" and [a["provider"] for a in outcome["attempts"]] == ["bedrock-apne2"]
