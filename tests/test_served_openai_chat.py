"""OpenAI Chat Completions through the gateway with the official openai SDK, over real HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import UPSTREAM_KEY, Fakes, GatewayProcess
from tests.fakes import Reply, ToolCall

pytestmark = pytest.mark.served


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)


def test_completion_round_trip(client: openai.OpenAI, gateway: GatewayProcess, fakes: Fakes) -> None:
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    assert completion.choices[0].message.content == "Hello from the fake provider."
    assert completion.usage.prompt_tokens == 100
    [received] = fakes.openai_main.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert received.json["model"] == "gpt-4o-mini-2024-07-18"


def test_stream_with_usage_requested_by_the_client(client: openai.OpenAI, fakes: Fakes) -> None:
    stream = client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "Hi"}], stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello from the fake provider."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20


def test_stream_without_usage_hides_the_usage_chunk_the_gateway_asked_for(client: openai.OpenAI, gateway: GatewayProcess, fakes: Fakes) -> None:
    response = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], stream=True)
    chunks = list(response.parse())
    assert all(chunk.choices for chunk in chunks)  # no usage-only chunk reached the client
    assert fakes.openai_main.received[0].json["stream_options"] == {"include_usage": True}
    finished = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert finished["usage"]["output"] == 20 and finished["usage"]["complete"] is True
    assert finished["cost_micro_usd"] == 27  # ceil(100 × 0.15 + 20 × 0.60) micro-USD


def test_tool_calls_stream_through(client: openai.OpenAI, fakes: Fakes) -> None:
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Reply(text="", tool_calls=(ToolCall("lookup", {"q": "portcullis"}, id="call_1"),)))
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    )
    arguments = "".join(tc.function.arguments or "" for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or []))
    assert arguments == '{"q": "portcullis"}'


def test_body_goes_upstream_byte_for_byte(gateway: GatewayProcess, fakes: Fakes) -> None:
    body = b'{"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}],"temperature":0.2,"seed":7,"model":"gpt-4o-mini-exact"}'
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, headers={"authorization": f"Bearer {gateway.key('eng')}"})
    assert response.status_code == 200, response.text
    assert fakes.openai_main.received[0].body == body


def test_models_lists_only_what_the_key_may_use(gateway: GatewayProcess) -> None:
    eng = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"))
    assert {m.id for m in eng.models.list()} == {
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
        "claude-opus-4-1",
        "claude-sonnet-4-5-exact",
        "gpt-4o-mini",
        "gpt-4o-mini-exact",
        "local-llama",
    }
    eu = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eu-team"))
    # eu-team may use claude-* but only in eu-west-1, where sonnet and haiku have targets.
    assert {m.id for m in eu.models.list()} == {"claude-sonnet-4-5", "claude-haiku-4-5"}
    carol = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng", "carol"))
    assert {m.id for m in carol.models.list()} == {"claude-haiku-4-5"}
