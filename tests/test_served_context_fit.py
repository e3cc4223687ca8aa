"""Routing layer L5, context fit, served: a target whose context window cannot hold the
request as it will be sent (after the policy prompt) is skipped and audited with the
numbers; when none can, each protocol's SDK gets the 400 it knows, naming the sizes,
and nothing is reserved or sent. Token counts are not generation: they are unaffected.
The official SDKs (anthropic, openai, boto3) through a real gateway to the fakes."""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Iterator
from typing import Any

import anthropic
import botocore.exceptions
import openai
import pytest

from portcullis.engine.tokens import count_input_tokens
from tests.bedrock_helpers import bedrock_gateway, boto3_client, issue, reference_catalog, reference_tenants
from tests.bundles import target, write_bundle
from tests.conftest import BedrockFakes, Fakes, GatewayProcess
from tests.governance_helpers import budget_cap
from tests.integrity_helpers import AGENT_SAFETY

pytestmark = pytest.mark.served

# ~6,000 tokens by any count: more than the small windows below hold.
LONG = " ".join(f"item{i}" for i in range(1500))
# 2,400 bytes (over a 2,000-token window by its byte bound) but ~400 tokens: it fits.
WORDY = "hello " * 400
SHORT_CHAT = [{"role": "user", "content": "Summarise the report in one line."}]
PROMPT_OUTPUT = 16
THINKING = ["streaming", "tools", "vision", "thinking"]


def _priced(provider: str, model: str, input_usd: str = "3") -> dict[str, Any]:
    return {"provider": provider, "model": model, "effective_from": "2025-01-01", "usd_per_mtok": {"input": input_usd, "output": "15"}}


def _catalog() -> dict[str, Any]:
    catalog = reference_catalog()
    # The window a short chat request fits only without the policy prompt: its own tokens,
    # its output limit and 5 spare, counted as governance counts an OpenAI-compatible target.
    prompt_window = count_input_tokens({"messages": SHORT_CHAT, "max_tokens": PROMPT_OUTPUT}, True)[0] + PROMPT_OUTPUT + 5
    catalog["models"] |= {
        "fit-claude": {
            "targets": [
                target("anthropic-us", "claude-fit-small", "us-east-1", 1, context_window=2000, max_output_tokens=1024),
                target("anthropic-eu", "claude-fit-large", "eu-west-1", 2),
            ]
        },
        "fit-tiny": {
            "targets": [
                target("anthropic-us", "claude-fit-tiny", "us-east-1", 1, context_window=1000, max_output_tokens=512, capabilities=THINKING),
                target("bedrock-usw2", "anthropic.claude-fit-tiny-v1:0", "us-west-2", 2, context_window=1000, max_output_tokens=512, capabilities=THINKING),
            ]
        },
        "fit-gpt": {
            "targets": [
                target("openai-main", "gpt-fit-tiny", "us-east-1", 1, context_window=1000, max_output_tokens=512),
                target("openai-responses", "gpt-fit-tiny-r", "us-east-1", 2, context_window=1000, max_output_tokens=512),
            ]
        },
        "fit-prompt": {"targets": [target("openai-main", "gpt-fit-prompt", "us-east-1", 1, context_window=prompt_window, max_output_tokens=512)]},
    }
    catalog["prices"] += [
        _priced("anthropic-us", "claude-fit-small", input_usd="1000"),  # dear: a bound that counted it would show
        _priced("anthropic-eu", "claude-fit-large"),
        _priced("anthropic-us", "claude-fit-tiny"),
        _priced("bedrock-usw2", "anthropic.claude-fit-tiny-v1:0"),
        _priced("openai-main", "gpt-fit-tiny"),
        _priced("openai-responses", "gpt-fit-tiny-r"),
        _priced("openai-main", "gpt-fit-prompt"),
    ]
    return catalog


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, session_bedrock: BedrockFakes) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("context-fit")
    tenants = reference_tenants()
    tenants["teams"] |= {"fitters": {"models": ["fit-*"]}, "guarded-fitters": {"models": ["fit-*"]}}
    integrity = {"agent-safety": {**copy.deepcopy(AGENT_SAFETY), "teams": ["guarded-fitters"]}}
    governance = budget_cap("fitters", "50.00", "CalendarMonth") | budget_cap("guarded-fitters", "50.00", "CalendarMonth")
    bundle = write_bundle(directory / "bundle", tenants, _catalog(), governance=governance, integrity=integrity)
    running = bedrock_gateway(directory, session_fakes, session_bedrock, bundle, responses=True)
    yield running
    running.stop()


def claude(gateway: GatewayProcess, team: str = "fitters") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team), max_retries=0)


def chat(gateway: GatewayProcess, team: str = "fitters") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)


def record(gateway: GatewayProcess, request_id: str, event: str) -> dict[str, Any]:
    return next(r for r in gateway.records_for(request_id) if r["event"] == event)


def reservations(gateway: GatewayProcess, request_id: str) -> list[tuple]:
    with sqlite3.connect(gateway.directory / "state.db") as connection:
        return connection.execute("SELECT state FROM reservations WHERE request_id = ?", (request_id,)).fetchall()


def context_rejections(decision: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in decision["rejected_targets"] if "context_window" in r]


def test_a_request_only_the_second_target_holds_is_served_by_it_and_the_first_is_audited(fitted: GatewayProcess, fakes: Fakes) -> None:
    response = claude(fitted).messages.with_raw_response.create(model="fit-claude", max_tokens=64, messages=[{"role": "user", "content": LONG}])
    assert response.status_code == 200
    assert not fakes.anthropic_us.requests_for("claude-fit-small") and len(fakes.anthropic_eu.requests_for("claude-fit-large")) == 1
    request_id = response.headers["x-portcullis-request-id"]
    started = record(fitted, request_id, "request_started")
    [rejected] = context_rejections(started["decision"])
    assert rejected["provider"] == "anthropic-us" and rejected["model"] == "claude-fit-small" and rejected["reasons"] == ["context_exceeded"]
    assert rejected["context_window"] == 2000 and rejected["output_tokens"] == 64 and rejected["reasoning_tokens"] == 0
    # refused on its byte bound, then counted again with tiktoken: still too large, an estimate with its margin
    assert rejected["method"] == "estimate" and rejected["input_tokens"] > 2000
    assert rejected["margin_tokens"] == -(-rejected["input_tokens"] * 10 // 100)
    assert started["decision"]["targets"] == ["anthropic-us/claude-fit-small@us-east-1", "anthropic-eu/claude-fit-large@eu-west-1"]
    # the bound is the fitting target's: the dear small one (1,000 USD/Mtok) would make it over 1 USD
    assert started["reservation"]["bound_micro_usd"] < 1_000_000
    assert fitted.outcome(request_id)["served"]["model"] == "claude-fit-large"


def test_a_byte_bound_that_does_not_fit_is_counted_again_before_a_target_is_skipped(fitted: GatewayProcess, fakes: Fakes) -> None:
    assert len(WORDY.encode()) > 2000
    response = claude(fitted).messages.with_raw_response.create(model="fit-claude", max_tokens=64, messages=[{"role": "user", "content": WORDY}])
    assert response.status_code == 200
    assert len(fakes.anthropic_us.requests_for("claude-fit-small")) == 1 and not fakes.anthropic_eu.requests_for("claude-fit-large")
    assert context_rejections(record(fitted, response.headers["x-portcullis-request-id"], "request_started")["decision"]) == []


def _refused_sizes(gateway: GatewayProcess, request_id: str) -> list[dict[str, Any]]:
    denied = record(gateway, request_id, "request_denied")
    assert denied["error"] == {"kind": "invalid_request", "code": "context_length_exceeded"} and denied["stage"] == "admit"
    assert "reservation" not in denied and reservations(gateway, request_id) == []  # refused before anything was reserved
    return context_rejections(denied["decision"])


def test_messages_gets_invalid_request_error_naming_the_sizes(fitted: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(fitted).messages.create(model="fit-tiny", max_tokens=100, messages=[{"role": "user", "content": LONG}])
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded"
    assert "maximum context length is 1000 tokens" in error["message"] and "100 for the output" in error["message"]
    rejected = _refused_sizes(fitted, refused.value.response.headers["x-portcullis-request-id"])
    assert [(r["provider"], r["reasons"], r["context_window"]) for r in rejected] == [
        ("anthropic-us", ["context_exceeded"], 1000),
        ("bedrock-usw2", ["context_exceeded"], 1000),
    ]
    needed = rejected[0]["input_tokens"] + rejected[0]["margin_tokens"] + rejected[0]["output_tokens"]
    assert f"needs {needed} " in error["message"]
    assert not fakes.anthropic_us.requests_for("claude-fit-tiny")


def test_chat_gets_context_length_exceeded_as_openai_sends_it(fitted: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(fitted).chat.completions.create(model="fit-gpt", max_tokens=100, messages=[{"role": "user", "content": LONG}])
    assert refused.value.code == "context_length_exceeded" and refused.value.type == "invalid_request_error"
    assert "maximum context length is 1000 tokens" in refused.value.message
    rejected = _refused_sizes(fitted, refused.value.response.headers["x-portcullis-request-id"])
    assert rejected[0]["method"] == "exact" and rejected[0]["margin_tokens"] == 0  # tiktoken for an OpenAI-compatible target
    assert not fakes.openai_main.received


def test_responses_gets_context_length_exceeded_too(fitted: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(fitted).responses.create(model="fit-gpt", max_output_tokens=100, input=LONG)
    assert refused.value.code == "context_length_exceeded" and refused.value.type == "invalid_request_error"
    assert "maximum context length is 1000 tokens" in refused.value.message
    assert len(_refused_sizes(fitted, refused.value.response.headers["x-portcullis-request-id"])) == 2
    assert not fakes.openai_main.received


def test_converse_gets_a_validation_exception_naming_the_sizes(fitted: GatewayProcess, bedrock: BedrockFakes) -> None:
    client = boto3_client(fitted, issue(fitted, "fitters"))
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        client.converse(modelId="fit-tiny", messages=[{"role": "user", "content": [{"text": LONG}]}], inferenceConfig={"maxTokens": 100})
    response = refused.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400 and response["Error"]["Code"] == "ValidationException"
    assert "maximum context length is 1000 tokens" in response["Error"]["Message"]
    assert len(_refused_sizes(fitted, response["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"])) == 2
    assert not bedrock.usw2.received


def test_a_declared_reasoning_budget_counts_within_the_output(fitted: GatewayProcess) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(fitted).messages.create(
            model="fit-tiny", max_tokens=900, thinking={"type": "enabled", "budget_tokens": 600}, messages=[{"role": "user", "content": "Hi"}]
        )
    assert refused.value.body["error"]["code"] == "context_length_exceeded"
    rejected = _refused_sizes(fitted, refused.value.response.headers["x-portcullis-request-id"])
    # 600 is not below the 512-token output ceiling: the budget cannot be spent there
    assert rejected[0]["reasoning_tokens"] == 600 and rejected[0]["reasons"] == ["output_exceeded"]
    assert "reasoning budget of 600 tokens" in refused.value.body["error"]["message"]


def test_the_policy_prompt_is_counted_and_can_push_a_request_over(fitted: GatewayProcess, fakes: Fakes) -> None:
    served = chat(fitted, "fitters").chat.completions.with_raw_response.create(model="fit-prompt", max_tokens=PROMPT_OUTPUT, messages=SHORT_CHAT)
    assert served.status_code == 200
    with pytest.raises(openai.BadRequestError) as refused:  # the same request, with the team's policy prompt inserted
        chat(fitted, "guarded-fitters").chat.completions.create(model="fit-prompt", max_tokens=PROMPT_OUTPUT, messages=SHORT_CHAT)
    assert refused.value.code == "context_length_exceeded"
    [rejected] = _refused_sizes(fitted, refused.value.response.headers["x-portcullis-request-id"])
    plain = count_input_tokens({"messages": SHORT_CHAT, "max_tokens": PROMPT_OUTPUT}, True)[0]
    assert rejected["input_tokens"] > plain + 5 and rejected["method"] == "exact"
    assert len(fakes.openai_main.requests_for("gpt-fit-prompt")) == 1  # only the one that fit went upstream


def test_a_token_count_is_not_held_to_the_window(fitted: GatewayProcess, fakes: Fakes) -> None:
    counted = claude(fitted).messages.count_tokens(model="fit-tiny", messages=[{"role": "user", "content": LONG}])
    assert counted.input_tokens > 1000  # more than the window: counted all the same
    assert len(fakes.anthropic_us.received) == 1
