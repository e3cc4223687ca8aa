"""Bad input gets a clear 4xx in the client's own protocol format, never a 5xx."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Fakes, GatewayProcess

pytestmark = pytest.mark.served

ANTHROPIC = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


def anthropic_call(gateway: GatewayProcess, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/messages", content=body, headers={**ANTHROPIC, "x-api-key": gateway.key("eng"), **(headers or {})})


def openai_call(gateway: GatewayProcess, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", content=body, headers={"authorization": f"Bearer {gateway.key('eng')}", "content-type": "application/json"}
    )


CASES = [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "empty"),
    (b"[1, 2]", 400, "JSON object"),
    (b"\xff\xfe{}", 400, "UTF-8"),
    (b'{"max_tokens": 5, "messages": []}', 400, "model: field required"),
    (b'{"model": 42, "max_tokens": 5, "messages": []}', 400, "model: expected a non-empty string"),
    (b'{"model": "haiku", "max_tokens": "5", "messages": []}', 400, "max_tokens: expected a positive integer"),
    (b'{"model": "haiku", "max_tokens": 5, "messages": {}}', 400, "messages: expected an array"),
    (b'{"model": "haiku", "max_tokens": 5, "messages": [], "stream": "yes"}', 400, "stream: expected a boolean"),
    (b'{"model": "haiku", "messages": []}', 400, "max_tokens: field required"),
    (b'{"model": "no-such-model", "max_tokens": 5, "messages": []}', 404, "not served"),
    (b'{"model": "no such model \\u0000 <script>", "max_tokens": 5, "messages": []}', 404, "<unprintable name>"),
]


@pytest.mark.parametrize(("body", "status", "message"), CASES)
def test_anthropic_bad_input(gateway: GatewayProcess, fakes: Fakes, body: bytes, status: int, message: str) -> None:
    response = anthropic_call(gateway, body)
    assert response.status_code == status
    document = response.json()
    assert document["type"] == "error" and message in document["error"]["message"]
    assert not any(fake.received for fake in fakes.all())


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model: field required"),
        (b'{"model": "gpt-4o-mini", "messages": []}', 400, "at least one message"),
        (b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
        (b'{"model": "gpt-4o-mini", "messages": ["x"]}', 400, "messages[0]: expected an object"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "not served"),
    ],
)
def test_openai_bad_input(gateway: GatewayProcess, body: bytes, status: int, message: str) -> None:
    response = openai_call(gateway, body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_body_over_the_limit_is_413_declared_or_streamed(gateway: GatewayProcess, fakes: Fakes) -> None:
    big = b'{"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "' + b"x" * 300_000 + b'"}]}'
    declared = anthropic_call(gateway, big)
    assert declared.status_code == 413 and declared.json()["error"]["type"] == "request_too_large"

    def chunks():
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    streamed = httpx.post(f"{gateway.url}/v1/chat/completions", content=chunks(), headers={"authorization": f"Bearer {gateway.key('eng')}"})
    assert streamed.status_code == 413 and "exceeds the limit" in streamed.json()["error"]["message"]
    assert not any(fake.received for fake in fakes.all())


def test_unknown_paths_and_methods_answer_in_json(gateway: GatewayProcess) -> None:
    missing = httpx.post(f"{gateway.url}/v1/nothing-here", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_route"
    wrong_method = httpx.get(f"{gateway.url}/v1/messages")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert "POST" in wrong_method.headers["allow"]


def test_upstream_validation_error_is_relayed_as_400(gateway: GatewayProcess, fakes: Fakes) -> None:
    # The gateway does not second-guess what the provider validates: the provider's
    # own 400 comes back as a 400 in the client's format, and is not retried.
    response = anthropic_call(gateway, b'{"model": "haiku", "max_tokens": 5}')
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "messages: field required"
    response = anthropic_call(gateway, b'{"model": "haiku", "max_tokens": 5, "messages": []}', {"anthropic-version": ""})
    assert response.status_code in (200, 400)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"model": "\\ud800", "max_tokens": 5, "messages": []}', "unpaired UTF-16 surrogate"),
        (b'{"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "\\udc00"}]}', "unpaired UTF-16 surrogate"),
        (b'{"model": "haiku", "model": "claude-opus-4-1", "max_tokens": 5, "messages": []}', "duplicated member: model"),
        (b'{"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "a", "content": "b"}]}', "duplicated member: content"),
        (b'{"model": "haiku", "mod\\u0065l": "claude-opus-4-1", "max_tokens": 5, "messages": []}', "duplicated member: model"),
        (b'{"model": "haiku", "max_tokens": 5, "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nesting too deep"),
        (b'{"model": "haiku", "max_tokens": ' + b"9" * 5000 + b', "messages": []}', "number too long"),
    ],
)
def test_hostile_bodies_are_refused_and_the_gateway_survives(gateway: GatewayProcess, fakes: Fakes, body: bytes, message: str) -> None:
    response = anthropic_call(gateway, body)
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert not any(fake.received for fake in fakes.all())
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/chat/completions", {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}], "stop": 5}, "stop: expected"),
        (
            "/v1/messages",
            {"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": 7},
            "stop_sequences: expected",
        ),
        ("/v1/messages", {"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "metadata": "u1"}, "metadata: expected"),
        (
            "/v1/messages",
            {"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
            "text: expected a string",
        ),
    ],
)
def test_wrong_types_in_converted_requests_are_400(gateway: GatewayProcess, fakes: Fakes, path: str, body: dict, message: str) -> None:
    headers = {"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"}
    response = httpx.post(f"{gateway.url}{path}", json=body, headers=headers)
    assert response.status_code == 400, response.text
    document = response.json()
    assert message in (document["error"]["message"])
    assert not any(fake.received for fake in fakes.all())
