"""Streams and guards for the prompt integrity unit suites: a policy with a canary,
Anthropic and OpenAI events as providers send them, and running a guard event by event."""

from __future__ import annotations

import asyncio
from typing import Any

from portcullis.adapters.protocols.sse import SSEEvent, SSEParser, encode
from portcullis.adapters.protocols.text import ToolCall
from portcullis.engine.integrity.policy import IntegrityPolicy

CANARY = "PCX-CANARY-unit-1234abcd"
POLICY = IntegrityPolicy.from_plan(
    {
        "policies": ["p"],
        "prompt": {"version": "p@1", "text": "Rules.", "canaries": [CANARY]},
        "spotlight": [],
        "injection": {"surfaces": {}, "thresholds": {}},
        "tools": {"allow": [], "deny": ["remote-script-pipe"], "declared_only": False},
        "output": {"actions": {"canary": "withhold", "secrets": "redact", "urls": "flag"}, "allowed_hosts": [["*.acme.example"]]},
    }
)


def event(document: dict[str, Any], name: str | None = None) -> SSEEvent:
    [parsed] = SSEParser().feed(encode(document, name))
    return parsed


def deny_bash(call: ToolCall) -> str | None:
    return "no shell" if call.name == "bash" else None


def run(guard: Any, events: list[SSEEvent]) -> list[SSEEvent]:
    async def go() -> list[SSEEvent]:
        out = []
        for item in events:  # one event per batch: the worst case for holding
            out += await guard.events([item])
        return out + await guard.finish()

    return asyncio.run(go())


def anthropic_tool_stream(name: str, arguments: str, pieces: int = 3) -> list[SSEEvent]:
    size = -(-len(arguments) // pieces)
    return [
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Running it."}}, "content_block_delta"),
        event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        event(
            {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}},
            "content_block_start",
        ),
        *[
            event(
                {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": arguments[i : i + size]}},
                "content_block_delta",
            )
            for i in range(0, len(arguments), size)
        ],
        event({"type": "content_block_stop", "index": 1}, "content_block_stop"),
        event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 9}}, "message_delta"),
        event({"type": "message_stop"}, "message_stop"),
    ]


def chat_stream(calls: list[tuple[str, str]]) -> list[SSEEvent]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
        return event(
            {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    events = [chunk({"role": "assistant", "content": None})]
    for i, (name, arguments) in enumerate(calls):
        events.append(chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[j : j + 5]}}]}) for j in range(0, len(arguments), 5)]
    events.append(chunk({}, "tool_calls"))
    return [*events, SSEEvent(None, "[DONE]", b"data: [DONE]\n\n")]


def assembled(events: list[SSEEvent]) -> tuple[dict[int, dict[str, str]], str, str | None]:
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for e in events:
        if e.data == "[DONE]":
            continue
        choice = e.json()["choices"][0]
        content += choice["delta"].get("content") or ""
        finish = choice["finish_reason"] or finish
        for call in choice["delta"].get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name") or ""
            entry["arguments"] += call.get("function", {}).get("arguments") or ""
    return calls, content, finish


def text_stream(text: str, size: int) -> list[SSEEvent]:
    return [
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text[i : i + size]}}, "content_block_delta")
        for i in range(0, len(text), size)
    ] + [event({"type": "content_block_stop", "index": 0}, "content_block_stop")]


def streamed_text(events: list[SSEEvent]) -> str:
    return "".join(e.json()["delta"]["text"] for e in events if e.event == "content_block_delta")


def responses_stream(reply: Any) -> list[SSEEvent]:
    """A Responses stream as the fake provider writes one, for a ``tests.fakes.Reply``."""
    from tests.fakes.openai_responses import events, output_items

    payload = {"model": "m", "include": ["reasoning.encrypted_content"]}
    return [event for chunk in events("resp_1", payload, output_items(reply, payload), reply) for event in SSEParser().feed(chunk)]
