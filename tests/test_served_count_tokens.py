"""Token counts (``POST /v1/messages/count_tokens``) end to end: the official SDK's
``client.messages.count_tokens`` over real HTTP through a gateway process to the fake
provider. A count runs the inference pipeline's stages (authentication, alias, RBAC,
region lock, PII, the policy prompt) but is never billed; its answers and errors are
the provider's, or a labelled local estimate for targets that cannot count."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import pytest

from portcullis.engine.tokens import count_input_tokens
from tests.conftest import Fakes, GatewayProcess, Services
from tests.fakes import Fail
from tests.fakes.anthropic_messages import COUNT_PATH, counted
from tests.governance_helpers import METERED, budget_cap, ledger_rows, metered_bundle, shared, unique_team
from tests.integrity_helpers import POLICY_TEXT, integrity_bundle
from tests.pii_helpers import EMAIL, RRN, pii_bundle

pytestmark = pytest.mark.served

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
OPUS_UPSTREAM = "claude-opus-4-1-20250805"
HI = [{"role": "user", "content": "Hello there, how many tokens is this?"}]
COUNT_HEADER = "x-portcullis-token-count"


def claude(gateway: GatewayProcess, team: str = "eng", user: str | None = None, env: dict[str, str] | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team, user, env), max_retries=0)


def counts(fake: object) -> list:
    return [r for r in fake.received if r.path == COUNT_PATH]  # type: ignore[attr-defined]


# --- forwarded: alias, the target's model id, byte-identical body -----------------------


def test_an_alias_is_counted_by_its_target_under_the_targets_model_id(gateway: GatewayProcess, fakes: Fakes) -> None:
    response = claude(gateway).messages.with_raw_response.count_tokens(model="sonnet", system="Be brief.", messages=HI)
    result = response.parse()
    assert response.status_code == 200 and response.headers[COUNT_HEADER] == "provider"
    [sent] = counts(fakes.anthropic_us)
    assert sent.json["model"] == SONNET_UPSTREAM
    assert result.input_tokens == counted(sent.json)
    assert "max_tokens" not in sent.json and sent.headers["x-api-key"] == fakes.anthropic_us.api_key
    assert not fakes.anthropic_us.requests_for(SONNET_UPSTREAM)[0].path.endswith("/v1/messages")
    outcome = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert outcome["event"] == "tokens_counted" and outcome["operation"] == "count_tokens"
    assert outcome["count"] == "provider" and outcome["input_tokens"] == result.input_tokens
    assert outcome["counted_by"]["provider"] == "anthropic-us" and "cost_micro_usd" not in outcome


def test_the_body_goes_upstream_as_sent_with_only_the_model_swapped(gateway: GatewayProcess, fakes: Fakes) -> None:
    raw = b'{"model":"sonnet",  "messages":[{"role":"user","content":"caf\\u00e9 \xe2\x98\x95"}], "tools":[]}'
    for path in ("/v1/messages/count_tokens", "/v1/messages/count_tokens/"):
        fakes.anthropic_us.reset()
        headers = {"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01", "content-type": "application/json"}
        answer = httpx.post(f"{gateway.url}{path}", content=raw, headers=headers)
        assert answer.status_code == 200, answer.text
        [sent] = counts(fakes.anthropic_us)
        assert sent.body == raw.replace(b'"sonnet"', f'"{SONNET_UPSTREAM}"'.encode())
        assert answer.json() == {"input_tokens": counted(json.loads(raw))}


# --- refused like inference -------------------------------------------------------------------


def test_rbac_and_the_region_lock_refuse_a_count(gateway: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        claude(gateway, "eng", "carol").messages.count_tokens(model="sonnet", messages=HI)
    assert refused.value.body["error"]["type"] == "permission_error"
    with pytest.raises(anthropic.PermissionDeniedError):
        claude(gateway, "eu-team").messages.count_tokens(model="claude-opus-4-1", messages=HI)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.url, api_key="pcx-not-a-key", max_retries=0).messages.count_tokens(model="sonnet", messages=HI)
    assert all(not fake.received for fake in fakes.all())
    denied = [r for r in gateway.records_for(refused.value.response.headers["x-portcullis-request-id"]) if r["event"] == "request_denied"]
    assert denied[0]["operation"] == "count_tokens" and denied[0]["stage"] == "decide"


def test_a_count_body_is_validated_like_a_messages_request(gateway: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(gateway).messages.count_tokens(model="sonnet", messages="hello")  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "invalid_request_error" and "messages" in refused.value.body["error"]["message"]
    assert not fakes.anthropic_us.received


def test_a_region_locked_count_goes_to_the_allowed_region(gateway: GatewayProcess, fakes: Fakes) -> None:
    claude(gateway, "eu-team").messages.count_tokens(model="sonnet", messages=HI)
    assert not fakes.anthropic_us.received and len(counts(fakes.anthropic_eu)) == 1


# --- what leaves: PII, the policy prompt -------------------------------------------------------


def test_pii_is_transformed_before_a_count_leaves_and_a_block_refuses(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway)
    client.messages.count_tokens(model="sonnet", messages=[{"role": "user", "content": f"Write to {EMAIL} today."}])
    [sent] = counts(fakes.anthropic_us)
    assert EMAIL not in sent.body.decode() and "maria" not in sent.body.decode()
    with pytest.raises(anthropic.BadRequestError) as blocked:
        client.messages.count_tokens(model="sonnet", messages=[{"role": "user", "content": f"My number is {RRN}."}])
    assert blocked.value.body["error"]["code"] == "pii_blocked"
    assert len(counts(fakes.anthropic_us)) == 1
    assert EMAIL not in gateway.audit_path.read_text() and RRN not in gateway.audit_path.read_text()


def test_the_count_includes_the_policy_prompt_inference_inserts(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=integrity_bundle(tmp_path / "b"))
    client = claude(gateway)
    result = client.messages.count_tokens(model="sonnet", messages=HI)
    client.messages.create(model="sonnet", max_tokens=16, messages=HI)
    [count] = counts(fakes.anthropic_us)
    [create] = [r for r in fakes.anthropic_us.received if r.path == "/v1/messages"]
    assert POLICY_TEXT in json.dumps(count.json["system"])
    assert count.json["system"] == create.json["system"] and count.json["messages"] == create.json["messages"]
    assert result.input_tokens == counted(count.json)


# --- targets that cannot count ------------------------------------------------------------------


def test_an_openai_target_gets_a_labelled_local_estimate(gateway: GatewayProcess, fakes: Fakes) -> None:
    response = claude(gateway).messages.with_raw_response.count_tokens(model="mini", messages=HI)
    assert response.status_code == 200 and response.headers[COUNT_HEADER] == "estimate"
    expected, method = count_input_tokens({"model": "mini", "messages": HI}, True)
    assert response.parse().input_tokens == expected and method == "tiktoken:cl100k_base"
    assert not fakes.openai_main.received
    outcome = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert outcome["event"] == "tokens_counted" and outcome["count"] == "estimate" and outcome["count_method"] == method


def test_an_estimate_never_overrides_a_denial(gateway: GatewayProcess) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        claude(gateway, "sonnet-only").messages.count_tokens(model="mini", messages=HI)
    assert COUNT_HEADER not in refused.value.response.headers


# --- never billed; its own limit --------------------------------------------------------------------


def test_a_count_is_never_reserved_or_settled(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    env, store = shared(services)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, budget_cap(team, "0.05", "CalendarDay")), env=env, store=store)
    client = claude(gateway, team, env=env)
    for _ in range(3):  # the budget holds one request's bound; counts never touch it
        response = client.messages.with_raw_response.count_tokens(model=METERED, messages=HI)
        assert response.status_code == 200
    assert ledger_rows(services, team) == []
    client.messages.create(model=METERED, max_tokens=1000, messages=HI)
    assert len(ledger_rows(services, team)) == 1
    records = gateway.settled()
    counted_records = [r for r in records if r["event"] == "tokens_counted"]
    assert len(counted_records) == 3 and all("charged_micro_usd" not in r and "settlement" not in r for r in counted_records)
    started = [r for r in records if r["event"] == "request_started" and r.get("operation") == "count_tokens"]
    assert len(started) == 3 and all("reservation" not in r for r in started)
    assert len([r for r in records if r["event"] == "request_finished"]) == 1


@pytest.mark.parametrize("kind", ["embedded", "shared"])
def test_counts_have_their_own_per_minute_limit(kind: str, tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    env, store = shared(services) if kind == "shared" else ({}, {})
    gateway = fresh_gateway(env=env, limits={"count_tokens_per_minute": 2}, **({"store": store} if store else {}))
    client = claude(gateway, env=env)
    for _ in range(2):
        client.messages.count_tokens(model="sonnet", messages=HI)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.count_tokens(model="sonnet", messages=HI)
    assert limited.value.body["error"]["type"] == "rate_limit_error" and limited.value.body["error"]["code"] == "count_tokens_rate_limited"
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    assert len(counts(fakes.anthropic_us)) == 2
    claude(gateway, env=env).messages.create(model="sonnet", max_tokens=8, messages=HI)  # inference is not limited by counts
    other = claude(gateway, "eng", "dave", env)  # another key has its own window
    other.messages.count_tokens(model="sonnet", messages=HI)


# --- the provider's errors, preserved ------------------------------------------------------------------


def test_a_providers_rate_limit_and_errors_reach_the_client(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()  # the 429 cools the provider key down: not the shared gateway's
    with pytest.raises(anthropic.BadRequestError) as invalid:  # the count endpoint takes no max_tokens; the provider says so
        claude(gateway).messages.count_tokens(model="claude-opus-4-1", messages=HI, extra_body={"max_tokens": 5})
    assert "max_tokens: Extra inputs are not permitted" in invalid.value.body["error"]["message"]
    outcome = gateway.outcome(invalid.value.response.headers["x-portcullis-request-id"])
    assert outcome["event"] == "request_failed" and outcome["operation"] == "count_tokens"
    fakes.anthropic_us.script(OPUS_UPSTREAM, Fail(429, retry_after=7))
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude(gateway).messages.count_tokens(model="claude-opus-4-1", messages=HI)
    assert limited.value.body["error"]["type"] == "rate_limit_error" and limited.value.response.headers["retry-after"] == "7"
    with pytest.raises(anthropic.RateLimitError) as cooling:  # the provider's key cools down, as after an inference 429
        claude(gateway).messages.count_tokens(model="claude-opus-4-1", messages=HI)
    assert cooling.value.body["error"]["code"] == "no_capacity" and len(counts(fakes.anthropic_us)) == 2



def test_a_failing_target_fails_over_to_the_next_that_counts(gateway: GatewayProcess, fakes: Fakes) -> None:
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(529))
    result = claude(gateway).messages.count_tokens(model="sonnet", messages=HI)
    assert len(counts(fakes.anthropic_us)) == 1 and len(counts(fakes.anthropic_eu)) == 1
    assert result.input_tokens == counted(counts(fakes.anthropic_eu)[0].json)

