"""The requests the benchmark sends, in each client protocol: the request through the
gateway, and the same request as its provider receives it, sent straight to the fake
(the baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bench.bundle_gen import BEDROCK_MODEL, BEDROCK_UPSTREAM

UPSTREAM_KEY = "sk-bench-upstream"
CHAT = [{"role": "user", "content": "Summarise the quarterly report in three bullet points."}]
CONVERSE = [{"role": "user", "content": [{"text": CHAT[0]["content"]}]}]
# team1's grant in the generated bundle that its Responses provider serves (bundle_gen.PROVIDERS)
RESPONSES_MODEL = "glm-m6"


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]  # through the gateway
    direct_path: str
    direct_body: dict[str, Any]
    direct_headers: dict[str, str]


def _same_path(name: str, path: str, body: dict[str, Any], upstream_model: str, direct: dict[str, str], gateway: dict[str, str]) -> Scenario:
    return Scenario(name, path, body, gateway, path, {**body, "model": upstream_model}, direct)


def scenarios(key: str) -> list[Scenario]:
    anthropic_headers = {"anthropic-version": "2023-06-01"}
    openai_direct, openai_gateway = {"authorization": f"Bearer {UPSTREAM_KEY}"}, {"authorization": f"Bearer {key}"}
    messages_direct, messages_gateway = {"x-api-key": UPSTREAM_KEY, **anthropic_headers}, {"x-api-key": key, **anthropic_headers}
    stream_chat = {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}}
    responses = {"model": RESPONSES_MODEL, "input": CHAT, "max_output_tokens": 64}
    messages = {"model": "claude-m0-latest", "messages": CHAT, "max_tokens": 64}
    bedrock = f"/model/{quote(BEDROCK_UPSTREAM, safe='')}"  # the fake's Bedrock Runtime, SigV4 unchecked for wrk
    invoke = {"anthropic_version": "bedrock-2023-05-31", "messages": CHAT, "max_tokens": 64}
    converse = {"messages": CONVERSE, "inferenceConfig": {"maxTokens": 64}}
    return [
        _same_path("chat", "/v1/chat/completions", {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64}, "gpt-m1-upstream", openai_direct, openai_gateway),
        _same_path("chat stream", "/v1/chat/completions", stream_chat, "gpt-m1-upstream", openai_direct, openai_gateway),
        _same_path("messages (alias)", "/v1/messages", messages, "claude-m0-upstream", messages_direct, messages_gateway),
        _same_path(
            "messages stream", "/v1/messages", {**messages, "model": "claude-m0", "stream": True}, "claude-m0-upstream", messages_direct, messages_gateway
        ),
        _same_path("responses", "/v1/responses", responses, f"{RESPONSES_MODEL}-upstream", openai_direct, openai_gateway),
        _same_path("responses stream", "/v1/responses", {**responses, "stream": True}, f"{RESPONSES_MODEL}-upstream", openai_direct, openai_gateway),
        # A Messages client served by a Bedrock target (InvokeModel, signed by the gateway).
        Scenario("messages→bedrock", "/v1/messages", {**messages, "model": BEDROCK_MODEL}, messages_gateway, f"{bedrock}/invoke", invoke, {}),
        # A Bedrock Runtime client (Converse, Bearer key) served by the same target.
        Scenario("bedrock converse", f"/model/{BEDROCK_MODEL}/converse", converse, openai_gateway, f"{bedrock}/converse", converse, {}),
        Scenario("bedrock stream", f"/model/{BEDROCK_MODEL}/converse-stream", converse, openai_gateway, f"{bedrock}/converse-stream", converse, {}),
    ]
