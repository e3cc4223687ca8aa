"""Anthropic Messages through the gateway with the official anthropic SDK, over real HTTP."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.conftest import UPSTREAM_KEY, Fakes, GatewayProcess
from tests.fakes import Reply, ToolCall

pytestmark = pytest.mark.served


@pytest.fixture
def client(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)


def test_message_reaches_the_provider_with_the_provider_key_and_comes_back(client: anthropic.Anthropic, gateway: GatewayProcess, fakes: Fakes) -> None:
    message = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text == "Hello from the fake provider."
    assert message.usage.input_tokens == 100 and message.usage.output_tokens == 20
    [received] = fakes.anthropic_us.received
    assert received.headers["x-api-key"] == UPSTREAM_KEY
    assert gateway.keys["eng/"] not in json.dumps(received.headers)  # the client's key never goes upstream
    assert "authorization" not in received.headers
    assert received.json["model"] == "claude-sonnet-4-5-20250929"


def test_alias_resolves_to_the_canonical_model(client: anthropic.Anthropic, gateway: GatewayProcess, fakes: Fakes) -> None:
    response = client.messages.with_raw_response.create(model="sonnet", max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    request_id = response.headers["x-portcullis-request-id"]
    assert response.parse().model == "claude-sonnet-4-5-20250929"
    assert fakes.anthropic_us.received[0].json["model"] == "claude-sonnet-4-5-20250929"
    started = next(r for r in gateway.records_for(request_id) if r["event"] == "request_started")
    assert started["requested_model"] == "sonnet" and started["model"] == "claude-sonnet-4-5"


def test_stream_is_relayed_and_accumulated_by_the_sdk(client: anthropic.Anthropic, fakes: Fakes) -> None:
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Reply(text="streamed answer", tool_calls=(ToolCall("get_weather", {"city": "Seoul"}),)))
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "Hi"}],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed answer"
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Seoul"}
    assert final.usage.output_tokens == 20 and final.stop_reason == "tool_use"


def test_body_goes_upstream_byte_for_byte(gateway: GatewayProcess, fakes: Fakes) -> None:
    # Key order, spacing, cache_control and unknown fields survive when nothing needs changing.
    body = (
        b'{"system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],\n'
        b' "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],\n'
        b' "messages": [{"role": "user", "content": "Hi \\u00e9"}, {"role": "system", "content": "inline"}],'
        b' "context_management": {"edits": []}, "max_tokens": 64, "model": "claude-sonnet-4-5-exact"}'
    )
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        content=body,
        headers={
            "x-api-key": gateway.key("eng"),
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "context-management-2025-06-27",
            "content-type": "application/json",
        },
    )
    assert response.status_code == 200, response.text
    [received] = fakes.anthropic_us.received
    assert received.body == body
    assert received.headers["anthropic-beta"] == "context-management-2025-06-27"


def test_only_the_model_name_changes_when_an_alias_is_used(gateway: GatewayProcess, fakes: Fakes) -> None:
    body = b'{ "model" : "sonnet",\n  "max_tokens": 64, "messages": [{"role": "user", "content": "x"}] }'
    response = httpx.post(f"{gateway.url}/v1/messages", content=body, headers={"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    assert fakes.anthropic_us.received[0].body == body.replace(b'"sonnet"', b'"claude-sonnet-4-5-20250929"')


def test_bearer_and_x_api_key_both_authenticate(gateway: GatewayProcess) -> None:
    for header in ({"x-api-key": gateway.key("eng")}, {"authorization": f"Bearer {gateway.key('eng')}"}):
        response = httpx.post(
            f"{gateway.url}/v1/messages",
            json={"model": "haiku", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
            headers={**header, "anthropic-version": "2023-06-01"},
        )
        assert response.status_code == 200, response.text


def test_claude_code_style_request_passes_through(gateway: GatewayProcess, fakes: Fakes) -> None:
    body = {
        "model": "claude-sonnet-4-5-exact",
        "max_tokens": 32,
        "stream": True,
        "thinking": {"type": "disabled"},
        "metadata": {"user_id": "session-1"},
        "output_config": {"effort": "low"},
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert httpx.head(gateway.url).status_code == 200
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/messages?beta=true",
        json=body,
        headers={"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01", "x-claude-code-session-id": "s"},
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("event:")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    assert fakes.anthropic_us.received[0].path == "/v1/messages?beta=true"
    assert "x-claude-code-session-id" not in fakes.anthropic_us.received[0].headers


def test_nothing_of_the_provider_reaches_the_client(gateway: GatewayProcess, fakes: Fakes) -> None:
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "haiku", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 200
    assert UPSTREAM_KEY not in str(response.headers) and UPSTREAM_KEY not in response.text
    assert response.headers["request-id"] == response.headers["x-portcullis-request-id"]  # ours, not the provider's


def test_client_disconnect_mid_stream_is_recorded_as_cancelled(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Reply(text="a long answer that the client will not wait for", event_delay=0.5))
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/messages",
        json={"model": "sonnet", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"},
    ) as response:
        request_id = response.headers["x-portcullis-request-id"]
        lines = response.iter_lines()
        assert next(lines).startswith("event: message_start")
    outcome = gateway.outcome(request_id)
    assert outcome["event"] == "request_cancelled"
    assert outcome["usage"]["input"] == 100 and outcome["usage"]["complete"] is False
    assert outcome["duration_ms"] < 2000  # noticed at once, not when the slow provider finished
