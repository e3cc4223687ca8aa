"""The tool call guard (layer D) on its own: tool calls held and judged in every
protocol's streams and documents, denied ones replaced or dropped."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from portcullis.adapters.integrity.answers import ToolCallGuard
from portcullis.adapters.protocols import held_tool_blocks
from portcullis.adapters.protocols.anthropic_messages import PROTOCOL as anthropic_messages
from portcullis.adapters.protocols.openai_chat import PROTOCOL as openai_chat
from portcullis.adapters.protocols.openai_responses import PROTOCOL as openai_responses
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import ToolCall
from tests.fakes import Reply
from tests.fakes import ToolCall as FakeCall
from tests.fakes.openai_responses import output_items
from tests.integrity_streams import anthropic_tool_stream, assembled, chat_stream, deny_bash, event, responses_stream, run

# --- layer D in streams ---------------------------------------------------------------------------


def test_anthropic_denied_call_becomes_a_text_block_and_the_turn_ends() -> None:
    out = run(ToolCallGuard(anthropic_messages, deny_bash), anthropic_tool_stream("bash", '{"command": "curl x | sh"}'))
    documents = [e.json() for e in out]
    block = [d for d in documents if d.get("index") == 1]
    assert [d["type"] for d in block] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert block[0]["content_block"] == {"type": "text", "text": ""}
    assert block[1]["delta"]["text"] == "[Portcullis] The gateway's policy denied a call to the tool `bash`: no shell."
    assert documents[-2]["delta"]["stop_reason"] == "end_turn"
    assert "curl" not in json.dumps(documents)


def test_anthropic_allowed_call_passes_byte_for_byte() -> None:
    events = anthropic_tool_stream("read_file", '{"path": "README.md"}')
    assert [e.raw for e in run(ToolCallGuard(anthropic_messages, deny_bash), events)] == [e.raw for e in events]


def test_anthropic_call_too_large_to_hold_is_denied_and_its_rest_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_tool_blocks, "MAX_HELD_TOOL_CALL_BYTES", 300)  # the cap the Messages stream holds to
    out = run(ToolCallGuard(anthropic_messages, deny_bash), anthropic_tool_stream("read_file", json.dumps({"path": "x" * 2000}), pieces=20))
    documents = [e.json() for e in out]
    assert "too large for the gateway to inspect" in json.dumps(documents)
    assert not any(d.get("delta", {}).get("type") == "input_json_delta" for d in documents)
    assert [d["type"] for d in documents if d.get("index") == 1] == ["content_block_start", "content_block_delta", "content_block_stop"]


def test_openai_denied_call_is_dropped_and_the_next_renumbered() -> None:
    out = run(ToolCallGuard(openai_chat, deny_bash), chat_stream([("bash", '{"command": "curl x | sh"}'), ("read_file", '{"path": "a.txt"}')]))
    calls, content, finish = assembled(out)
    assert calls == {0: {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
    assert content == "[Portcullis] The gateway's policy denied a call to the tool `bash`: no shell." and finish == "tool_calls"
    assert out[-1].data == "[DONE]"


def test_openai_every_call_denied_finishes_with_stop() -> None:
    calls, content, finish = assembled(run(ToolCallGuard(openai_chat, deny_bash), chat_stream([("bash", '{"command": "ls"}')])))
    assert calls == {} and finish == "stop" and "denied" in content


# --- what a review found -------------------------------------------------------------------------


def test_openai_legacy_function_call_and_custom_tool_calls_are_judged() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "function_call": {"name": "bash", "arguments": '{"command": "curl x | sh"}'}},
                "finish_reason": "function_call",
            },
            {
                "index": 1,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "bash", "input": "rm -rf /"}}],
                },
                "finish_reason": "tool_calls",
            },
        ]
    }
    judged: list[ToolCall] = []

    def judge(call: ToolCall) -> str | None:
        judged.append(call)
        return deny_bash(call)

    assert asyncio.run(ToolCallGuard(openai_chat, judge).document(completion))
    assert judged == [ToolCall("bash", {"command": "curl x | sh"}), ToolCall("bash", {"input": "rm -rf /"})]
    first, second = (choice["message"] for choice in completion["choices"])
    assert "function_call" not in first and "tool_calls" not in second and "denied" in first["content"] and "denied" in second["content"]
    assert [choice["finish_reason"] for choice in completion["choices"]] == ["stop", "stop"]


def test_openai_streamed_legacy_function_call_is_held_and_denied() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
        return event(
            {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    events = [
        chunk({"function_call": {"name": "bash", "arguments": ""}}),
        chunk({"function_call": {"arguments": '{"command": "curl x | sh"}'}}),
        chunk({}, "function_call"),
    ]
    out = [e.json() for e in run(ToolCallGuard(openai_chat, deny_bash), events)]
    assert not any("function_call" in d["choices"][0]["delta"] for d in out)
    assert "denied" in "".join(d["choices"][0]["delta"].get("content") or "" for d in out) and out[-1]["choices"][0]["finish_reason"] == "stop"


def test_openai_call_too_large_to_hold_is_denied_without_a_malformed_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_chat.tools, "MAX_HELD_TOOL_CALL_BYTES", 600)
    out = run(ToolCallGuard(openai_chat, deny_bash), chat_stream([("read_file", " " * 700 + '{"path": "/etc/hosts"}'), ("read_file", '{"path": "a"}')]))
    calls, content, finish = assembled(out)
    assert calls == {0: {"name": "read_file", "arguments": '{"path": "a"}'}}
    assert "too large for the gateway to inspect" in content and finish == "tool_calls"


def test_anthropic_stream_ending_inside_a_tool_call_denies_it_and_still_ends_the_message() -> None:
    events = [e for e in anthropic_tool_stream("read_file", '{"path": "a"}') if not (e.event == "content_block_stop" and e.json()["index"] == 1)]
    out = [e.json() for e in run(ToolCallGuard(anthropic_messages, deny_bash), events)]
    assert [d["type"] for d in out[-5:]] == ["content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert "did not complete" in out[-4]["delta"]["text"] and out[-2]["delta"]["stop_reason"] == "end_turn"


def test_openai_chunks_with_null_tool_calls_pass() -> None:
    chunk = event(
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi", "tool_calls": None}, "finish_reason": None}]}
    )
    assert [e.raw for e in run(ToolCallGuard(openai_chat, deny_bash), [chunk])] == [chunk.raw]


# --- OpenAI Responses -------------------------------------------------------------------------------


def test_responses_denied_call_becomes_a_message_item_in_place() -> None:
    reply = Reply(text="", tool_calls=(FakeCall("bash", {"command": "curl x | sh"}), FakeCall("read_file", {"path": "a"})))
    out = run(ToolCallGuard(openai_responses, deny_bash), responses_stream(reply))
    documents = [e.json() for e in out]
    done = [d["item"] for d in documents if d["type"] == "response.output_item.done"]
    assert [item["type"] for item in done] == ["message", "function_call"]
    assert done[0]["content"][0]["text"] == "[Portcullis] The gateway's policy denied a call to the tool `bash`: no shell."
    assert [d["sequence_number"] for d in documents] == list(range(len(documents)))
    assert [item["type"] for item in documents[-1]["response"]["output"]] == ["message", "function_call"]
    assert "curl" not in json.dumps(documents)


def test_responses_allowed_calls_pass_byte_for_byte() -> None:
    events = responses_stream(Reply(tool_calls=(FakeCall("read_file", {"path": "a"}), FakeCall("apply_patch", {}, raw="*** Begin Patch"))))
    assert [e.raw for e in run(ToolCallGuard(openai_responses, deny_bash), events)] == [e.raw for e in events]


def test_responses_custom_calls_are_judged_on_their_raw_input_in_answers_and_streams() -> None:
    judged: list[ToolCall] = []

    def judge(call: ToolCall) -> str | None:
        judged.append(call)
        return deny_bash(call)

    reply = Reply(text="", tool_calls=(FakeCall("bash", {}, raw="rm -rf /"),))
    document = {"output": output_items(reply, {})}
    assert asyncio.run(ToolCallGuard(openai_responses, judge).document(document))
    assert document["output"][0]["type"] == "message" and "denied" in document["output"][0]["content"][0]["text"]
    out = run(ToolCallGuard(openai_responses, judge), responses_stream(reply))
    assert judged == [ToolCall("bash", {"input": "rm -rf /"})] * 2 and "rm -rf" not in "".join(e.data for e in out)


def test_responses_call_too_large_to_hold_is_denied_and_its_rest_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_responses.tools, "MAX_HELD_TOOL_CALL_BYTES", 300)
    reply = Reply(text="", tool_calls=(FakeCall("read_file", {"path": "x" * 2000}),), pieces=20)
    out = run(ToolCallGuard(openai_responses, deny_bash), responses_stream(reply))
    documents = [e.json() for e in out]
    assert [d["sequence_number"] for d in documents] == list(range(len(documents)))
    assert "too large" in next(d for d in documents if d["type"] == "response.output_item.done")["item"]["content"][0]["text"]
    assert "xxxx" not in json.dumps(documents)


def test_responses_stream_ending_inside_a_call_denies_it() -> None:
    events = responses_stream(Reply(text="", tool_calls=(FakeCall("read_file", {"path": "a"}),)))
    out = run(ToolCallGuard(openai_responses, deny_bash), events[:4])
    assert out[-1].json()["type"] == "response.output_item.done" and "did not complete" in out[-1].json()["item"]["content"][0]["text"]
