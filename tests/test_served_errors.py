"""Refusals as clients and operators read them: the client's own field paths, short
escaped excerpts instead of echoed values, a machine-readable code and a request id on
every response, provider 4xx kept 4xx, and unknown routes in the path's protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.bundles import CATALOG, TENANTS, deep_copy, write_bundle
from tests.conftest import Fakes, GatewayProcess
from tests.fakes import Fail

pytestmark = pytest.mark.served

ANTHROPIC = {"anthropic-version": "2023-06-01"}
HAIKU_UPSTREAM = "claude-haiku-4-5-20251001"


def messages(gateway: GatewayProcess, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/messages", json=body, headers={**ANTHROPIC, "x-api-key": gateway.key("eng"), **headers})


def chat(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {gateway.key('eng')}"})


@pytest.mark.parametrize(
    ("call", "body", "message"),
    [
        (messages, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": ["text"], "text": "x"}]}]},
         "messages[0].content[0].type: expected a string, got an array"),
        (messages, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": {"a": 1}}]}]},
         "messages[0].content[0].type: expected a string, got an object"),
        (messages, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 7, "content": "x"}]}]},
         "messages[0].content[0].tool_use_id: expected a string, got a number"),
        (messages, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": ["bash"]}]},
         "tools[0].name: expected a string, got an array"),
        (chat, {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}, {"role": ["user"], "content": "y"}]},
         "messages[1].role: expected a string, got an array"),
        (chat, {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [{"type": {"t": "text"}, "text": "x"}]}]},
         "messages[0].content[0].type: expected a string, got an object"),
        (chat, {"model": "gpt-4o-mini", "messages": [{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f", "arguments": "{}"}}]}]},
         "messages[0].tool_calls[0].id: expected a string, got a number"),
    ],
)  # fmt: skip
def test_wrong_types_are_400s_that_name_the_clients_field(gateway: GatewayProcess, fakes: Fakes, call: Any, body: dict[str, Any], message: str) -> None:
    response = call(gateway, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == message
    assert response.headers["x-portcullis-error-code"] == "invalid_request"
    assert "Traceback" not in gateway.logs()
    assert not any(fake.received for fake in fakes.all())


def test_unknown_but_valid_fields_still_pass_through_byte_for_byte(gateway: GatewayProcess, fakes: Fakes) -> None:
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 5,
        "messages": [
            {"role": "system", "content": "inside messages"},
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]},
        ],
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "abc"},
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    response = httpx.post(f"{gateway.url}/v1/messages", content=raw, headers={**ANTHROPIC, "x-api-key": gateway.key("eng")})
    assert response.status_code == 200, response.text
    assert fakes.anthropic_eu.received[-1].body == raw.replace(b'"claude-haiku-4-5"', f'"{HAIKU_UPSTREAM}"'.encode())


def test_errors_echo_a_short_escaped_excerpt_never_the_whole_value(gateway: GatewayProcess) -> None:
    huge_role = "<b>" + "r" * 200_000
    response = chat(gateway, {"model": "haiku", "messages": [{"role": huge_role, "content": "x"}]})  # converted for an Anthropic provider
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert len(response.content) < 500 and "rrrr…" in message and "<b>" not in message and "\\u003cb\\u003e" in message
    response = messages(gateway, {"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "x" * 100_000}]}]})
    assert response.status_code == 400 and len(response.content) < 500


@pytest.fixture
def prompt_gateway(tmp_path: Path, fresh_gateway: Any) -> GatewayProcess:
    policy = {"teams": ["eng"], "prompt": {"version": "1", "text": "Follow the company's rules."}}
    return fresh_gateway(bundle=write_bundle(tmp_path / "b", deep_copy(TENANTS), deep_copy(CATALOG), integrity={"rules": policy}))


def test_error_paths_keep_the_clients_index_when_a_policy_prompt_is_inserted(prompt_gateway: GatewayProcess, fakes: Fakes) -> None:
    late_system = {"model": "haiku", "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}
    response = chat(prompt_gateway, late_system)  # Chat client, Anthropic provider: the prompt is messages[0] upstream
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("messages[1]: a system message after the conversation started")
    image_in_system = {
        "model": "gpt-4o-mini",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "a"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    response = messages(prompt_gateway, image_in_system)  # Messages client, Chat provider: the prompt is system[0]
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("system[1]: only text blocks")
    assert not any(fake.received for fake in fakes.all())


def test_every_refusal_carries_a_code_both_sdks_read(gateway: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as refused:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert refused.value.body["error"]["code"] == "unknown_model"  # type: ignore[index]
    assert refused.value.response.headers["x-portcullis-error-code"] == "unknown_model"
    assert refused.value.request_id == refused.value.response.headers["x-portcullis-request-id"]
    with pytest.raises(anthropic.AuthenticationError) as unauthenticated:
        anthropic.Anthropic(base_url=gateway.url, api_key="pk-wrong", max_retries=0).messages.create(
            model="haiku", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert unauthenticated.value.response.headers["x-portcullis-error-code"] == unauthenticated.value.body["error"]["code"]  # type: ignore[index]
    chat_client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        chat_client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], temperature="hot")  # type: ignore[arg-type]
    assert bad.value.code == "invalid_request" and bad.value.response.headers["x-portcullis-error-code"] == "invalid_request"


def test_every_response_carries_a_request_id(gateway: GatewayProcess) -> None:
    responses = [
        httpx.get(f"{gateway.url}/v1/models", headers=ANTHROPIC),  # 401: no key
        httpx.get(f"{gateway.url}/v1/models", headers={"x-api-key": gateway.key("eng"), **ANTHROPIC}),
        httpx.get(f"{gateway.url}/healthz"),
        httpx.get(f"{gateway.url}/readyz"),
        httpx.head(f"{gateway.url}/"),
        httpx.post(f"{gateway.url}/v1/responses/compact", json={}),
        httpx.get(f"{gateway.url}/v1/messages"),
        messages(gateway, {"model": "haiku"}),
    ]
    assert [r.status_code for r in responses] == [401, 200, 200, 200, 200, 404, 405, 400]
    ids = [r.headers["x-portcullis-request-id"] for r in responses]
    assert all(r.headers["request-id"] == r.headers["x-portcullis-request-id"] for r in responses)
    assert len(set(ids)) == len(ids)
    assert responses[0].json()["request_id"] == ids[0] and responses[0].headers["x-portcullis-error-code"]


def test_a_trailing_slash_is_served_never_redirected(gateway: GatewayProcess, fakes: Fakes) -> None:
    body = {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    headers = {**ANTHROPIC, "x-api-key": gateway.key("eng"), "host": "attacker.example"}
    response = httpx.post(f"{gateway.url}/v1/messages/", json=body, headers=headers, follow_redirects=False)
    assert response.status_code == 200 and "location" not in response.headers
    response = httpx.post(f"{gateway.url}/v1/models/", headers=headers, follow_redirects=False)
    assert response.status_code == 404 and "location" not in response.headers


def test_unknown_routes_answer_in_the_protocol_the_path_belongs_to(gateway: GatewayProcess) -> None:
    responses_api = httpx.post(f"{gateway.url}/v1/responses/compact", json={"model": "gpt-4o-mini", "input": "x"})
    assert responses_api.status_code == 404
    message = 'this gateway does not serve POST "/v1/responses/compact"'
    assert responses_api.json() == {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "unknown_route"}}
    converse = httpx.post(f"{gateway.url}/model/anthropic.claude-3-haiku-20240307-v1%3A0/count-tokens", json={"messages": []})
    assert converse.status_code == 404 and converse.headers["x-amzn-ErrorType"] == "UnknownOperationException"
    assert set(converse.json()) == {"message"} and converse.headers["x-amzn-RequestId"] == converse.headers["x-portcullis-request-id"]
    typo = httpx.post(f"{gateway.url}/v1/mesages", json={}, headers=ANTHROPIC)
    assert typo.status_code == 404 and typo.json()["type"] == "error" and typo.json()["error"]["type"] == "not_found_error"
    wrong_method = httpx.get(f"{gateway.url}/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    logs = gateway.logs()
    for response in (responses_api, converse, typo, wrong_method):
        assert f"{response.headers['x-portcullis-request-id']} unknown route" in logs


def test_a_provider_4xx_the_client_caused_stays_a_4xx(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_eu.script(HAIKU_UPSTREAM, Fail(431))
    response = messages(gateway, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, **{"anthropic-beta": "b" * 2000})
    assert response.status_code == 431 and response.json()["error"]["type"] == "request_too_large"
    assert response.headers["x-portcullis-error-code"] == "upstream_invalid_request"
    assert len(fakes.anthropic_eu.received) == 1  # another target would refuse it too: not retried


def test_an_oversized_forwarded_header_is_refused_before_dispatch(gateway: GatewayProcess, fakes: Fakes) -> None:
    beta = ",".join(f"feature-{i}-2025-01-01" for i in range(3500))  # ~80 KB
    response = messages(gateway, {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, **{"anthropic-beta": beta})
    assert response.status_code == 431 and response.headers["x-portcullis-error-code"] == "header_too_large"
    assert len(response.content) < 500
    assert not any(fake.received for fake in fakes.all())


def test_deep_json_inside_tool_arguments_is_capped_like_the_body(gateway: GatewayProcess, fakes: Fakes) -> None:
    # The translator and the filters parse and walk tool-call arguments as they do the body, so the same cap applies.
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "[" * 900 + "]" * 900}}
    body = {"model": "haiku", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}]}
    response = chat(gateway, body)
    assert response.status_code == 413 and response.headers["x-portcullis-error-code"] == "nesting_too_deep"
    assert "messages[1].tool_calls[0].function.arguments" in response.json()["error"]["message"]
    assert "Traceback" not in gateway.logs()
