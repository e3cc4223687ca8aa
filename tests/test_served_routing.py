"""Routing and availability: RBAC, region lock, re-authorised fallbacks, failover
before the response is committed and never after."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import Fakes, GatewayProcess, gateway_config
from tests.fakes import CutStream, Fail, Hang, Redirect, StreamError, free_port

pytestmark = pytest.mark.served

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
HAIKU_UPSTREAM = "claude-haiku-4-5-20251001"
HI = [{"role": "user", "content": "Hi"}]


def claude(gateway: GatewayProcess, team: str = "eng", user: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team, user), max_retries=0)


def decision_of(gateway: GatewayProcess, request_id: str) -> dict:
    record = next(r for r in gateway.records_for(request_id) if r["event"] in ("request_started", "request_denied"))
    return record["decision"]


def test_model_outside_the_allow_list_is_refused(gateway: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        claude(gateway, "eng", "carol").messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HI)
    assert refused.value.body["error"]["type"] == "permission_error"
    assert "not allowed" in refused.value.body["error"]["message"]
    assert all(not fake.received for fake in fakes.all())


def test_alias_of_a_forbidden_model_is_refused_too(gateway: GatewayProcess) -> None:
    with pytest.raises(anthropic.PermissionDeniedError):
        claude(gateway, "eng", "carol").messages.create(model="sonnet", max_tokens=8, messages=HI)


def test_unknown_model_is_not_found_in_each_protocol(gateway: GatewayProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude(gateway).messages.create(model="claude-imaginary", max_tokens=8, messages=HI)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(openai.NotFoundError) as missing_openai:
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0).chat.completions.create(model="gpt-imaginary", messages=HI)
    assert missing_openai.value.code == "model_not_found"


def test_region_lock_keeps_traffic_in_the_allowed_region(gateway: GatewayProcess, fakes: Fakes) -> None:
    response = claude(gateway, "eu-team").messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200
    assert not fakes.anthropic_us.received and len(fakes.anthropic_eu.received) == 1
    decision = decision_of(gateway, response.headers["x-portcullis-request-id"])
    assert decision["rejected_targets"][0]["region"] == "us-east-1" and decision["rejected_targets"][0]["reasons"] == ["region_not_allowed"]


def test_region_lock_refuses_a_model_with_no_target_in_region(gateway: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.PermissionDeniedError):
        claude(gateway, "eu-team").messages.create(model="claude-opus-4-1", max_tokens=8, messages=HI)
    with pytest.raises(anthropic.PermissionDeniedError):  # a user can narrow regions too
        claude(gateway, "eng", "dave").messages.create(model="claude-opus-4-1", max_tokens=8, messages=HI)
    assert not fakes.anthropic_us.received


def test_failover_to_the_next_target_before_anything_was_sent(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(529))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200
    assert len(fakes.anthropic_us.received) == 1 and len(fakes.anthropic_eu.received) == 1
    assert "x-portcullis-model-fallback" not in response.headers  # same model, another region
    finished = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert [a["outcome"] for a in finished["attempts"]] == ["status_529", "ok"]
    assert finished["served"]["region"] == "eu-west-1" and "model_substituted_from" not in finished


def test_fallback_model_is_visible_to_client_and_audit(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(500))
    fakes.anthropic_eu.script(SONNET_UPSTREAM, Fail(503))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200
    assert response.headers["x-portcullis-model-fallback"] == "claude-sonnet-4-5"
    assert response.parse().model == HAIKU_UPSTREAM
    finished = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert finished["model_substituted_from"] == "claude-sonnet-4-5"
    assert finished["served"]["canonical_model"] == "claude-haiku-4-5"


def test_fallback_is_reauthorised_and_never_reaches_a_forbidden_model(gateway: GatewayProcess, fakes: Fakes) -> None:
    # sonnet-only may use sonnet, whose fallback haiku it may not: when sonnet fails,
    # the request fails rather than escalating to haiku.
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(529))
    fakes.anthropic_eu.script(SONNET_UPSTREAM, Fail(529))
    with pytest.raises(anthropic.APIStatusError) as failed:
        claude(gateway, "sonnet-only").messages.create(model="sonnet", max_tokens=8, messages=HI)
    assert failed.value.status_code == 502
    assert not fakes.anthropic_eu.requests_for(HAIKU_UPSTREAM)
    record = next(
        r for r in gateway.settled() if r.get("event") == "request_failed" and r["attempts"][0]["model"] == SONNET_UPSTREAM and len(r["attempts"]) == 2
    )
    started = next(r for r in gateway.records_for(record["request_id"]) if r["event"] == "request_started")
    assert started["decision"]["rejected_targets"] == [
        {"provider": "anthropic-eu", "model": HAIKU_UPSTREAM, "region": "eu-west-1", "reasons": ["model_not_allowed"]}
    ]


def test_provider_rate_limit_reaches_the_client_and_cools_the_key(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Fail(429, retry_after=7))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="gpt-4o-mini", messages=HI)
    assert limited.value.response.headers["retry-after"] == "7"
    # The key rests for the provider's retry-after: the next request does not reach it.
    with pytest.raises(openai.RateLimitError) as resting:
        client.chat.completions.create(model="gpt-4o-mini", messages=HI)
    assert 0 < int(resting.value.response.headers["retry-after"]) <= 7
    assert len(fakes.openai_main.received) == 1


def test_timeout_fails_over(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Hang(6))  # the gateway's read timeout is 3 s
    message = claude(gateway).messages.create(model="sonnet", max_tokens=8, messages=HI)
    assert message.content[0].text and len(fakes.anthropic_eu.received) == 1


def test_stream_failing_before_its_first_event_fails_over(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, StreamError(after=0))
    with claude(gateway).messages.stream(model="sonnet", max_tokens=8, messages=HI) as stream:
        assert "".join(stream.text_stream) == "Hello from the fake provider."
    assert len(fakes.anthropic_eu.received) == 1


def test_no_failover_after_the_stream_was_committed(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, CutStream(after=4))
    received_text = []
    with pytest.raises(anthropic.APIStatusError) as cut, claude(gateway).messages.stream(model="sonnet", max_tokens=8, messages=HI) as stream:
        request_id = stream.response.headers["x-portcullis-request-id"]
        for text in stream.text_stream:
            received_text.append(text)
    assert "mid-stream" in str(cut.value)
    assert received_text  # the client had output before the failure
    assert not fakes.anthropic_eu.received  # and the gateway did not retry elsewhere
    failed = gateway.outcome(request_id)
    assert failed["event"] == "request_failed"
    assert failed["served"]["provider"] == "anthropic-us" and failed["usage"]["complete"] is False


def test_openai_stream_error_after_commit_ends_with_an_error_event(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", StreamError(after=2))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="gpt-4o-mini", messages=HI, stream=True):
            pass
    assert len(fakes.openai_main.received) == 1


def test_capability_missing_everywhere_is_a_clear_400(gateway: GatewayProcess, fakes: Fakes) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="local-llama", messages=HI, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        )
    assert "does not support" in refused.value.message
    assert not fakes.openai_main.received


def test_unreachable_provider_fails_over(fresh_gateway, fakes: Fakes) -> None:
    providers = gateway_config(Path("."), fakes, Path("."))["providers"]
    providers[0]["base_url"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gateway = fresh_gateway(providers=providers)
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200
    finished = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert [a["outcome"] for a in finished["attempts"]] == ["connect", "ok"]


def test_every_target_failing_is_a_502_in_the_client_protocol(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(503))
    fakes.anthropic_eu.script(SONNET_UPSTREAM, Fail(503))
    fakes.anthropic_eu.script(HAIKU_UPSTREAM, Fail(503))
    with pytest.raises(anthropic.APIStatusError) as failed:
        claude(gateway).messages.create(model="sonnet", max_tokens=8, messages=HI)
    assert failed.value.status_code == 502
    assert failed.value.body["type"] == "error" and failed.value.body["error"]["type"] == "api_error"


def test_attempts_are_bounded(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(limits={"max_attempts": 1})
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(529))
    with pytest.raises(anthropic.APIStatusError):
        claude(gateway).messages.create(model="sonnet", max_tokens=8, messages=HI)
    assert not fakes.anthropic_eu.received


def test_provider_refusing_the_gateway_fails_over(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(401))  # an expired key on one target
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200 and len(fakes.anthropic_eu.received) == 1


def test_redirects_are_never_followed(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Redirect(f"{fakes.openai_main.url}/v1/messages"))
    response = claude(gateway).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=HI)
    assert response.status_code == 200
    assert not fakes.openai_main.received  # neither the provider key nor the prompt went elsewhere
    finished = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert [a["outcome"] for a in finished["attempts"]] == ["status_307", "ok"]
