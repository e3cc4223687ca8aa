"""The requests the benchmark sends, in each client protocol: (name, path, body through
the gateway, the upstream model the same body names when sent straight to the fake,
headers straight to the fake, headers through the gateway)."""

from __future__ import annotations

from typing import Any

UPSTREAM_KEY = "sk-bench-upstream"
CHAT = [{"role": "user", "content": "Summarise the quarterly report in three bullet points."}]
# team1's grant in the generated bundle that its Responses provider serves (bundle_gen.PROVIDERS)
RESPONSES_MODEL = "glm-m6"

Scenario = tuple[str, str, dict[str, Any], str, dict[str, str], dict[str, str]]


def scenarios(key: str) -> list[Scenario]:
    anthropic_headers = {"anthropic-version": "2023-06-01"}
    openai_direct, openai_gateway = {"authorization": f"Bearer {UPSTREAM_KEY}"}, {"authorization": f"Bearer {key}"}
    messages_direct, messages_gateway = {"x-api-key": UPSTREAM_KEY, **anthropic_headers}, {"x-api-key": key, **anthropic_headers}
    stream_chat = {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}}
    responses = {"model": RESPONSES_MODEL, "input": CHAT, "max_output_tokens": 64}
    messages = {"model": "claude-m0-latest", "messages": CHAT, "max_tokens": 64}
    return [
        ("chat", "/v1/chat/completions", {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64}, "gpt-m1-upstream", openai_direct, openai_gateway),
        ("chat stream", "/v1/chat/completions", stream_chat, "gpt-m1-upstream", openai_direct, openai_gateway),
        ("messages (alias)", "/v1/messages", messages, "claude-m0-upstream", messages_direct, messages_gateway),
        ("messages stream", "/v1/messages", {**messages, "model": "claude-m0", "stream": True}, "claude-m0-upstream", messages_direct, messages_gateway),
        ("responses", "/v1/responses", responses, f"{RESPONSES_MODEL}-upstream", openai_direct, openai_gateway),
        ("responses stream", "/v1/responses", {**responses, "stream": True}, f"{RESPONSES_MODEL}-upstream", openai_direct, openai_gateway),
    ]
