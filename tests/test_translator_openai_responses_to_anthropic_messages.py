"""Responses client → Messages provider: the translator on its own, its answers and
streams read by the ``openai`` SDK itself."""

from __future__ import annotations

import base64
import json

import pytest

from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.protocols.translators import openai_responses_to_anthropic_messages as translator
from portcullis.engine.errors import GatewayError
from portcullis.engine.plan import Target
from tests.fakes import anthropic_messages as fake
from tests.fakes.behaviours import Reply, ToolCall
from tests.translator_helpers import of_type, sdk_response, sdk_stream, translated_stream

TARGET = Target("claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 1, 200000, 64000, ("tools",))
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hi "there"\n*** End Patch\n'


def convert(**body) -> dict:
    document = {"model": "m", "input": "hi", **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def test_plain_input_instructions_sampling_and_cost_only_hints_dropped() -> None:
    out = convert(
        instructions="be brief",
        temperature=0.5,
        top_p=1,
        stream=True,
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        metadata={"a": "b"},
        service_tier="auto",
        reasoning={"effort": "high", "summary": "auto"},
        text={"format": {"type": "text"}, "verbosity": "low"},
        safety_identifier="u-1",
        truncation="disabled",
    )
    assert out == {
        "model": TARGET.model,
        "max_tokens": 64000,  # the target's ceiling: Messages requires one
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "system": [{"type": "text", "text": "be brief"}],
        "temperature": 0.5,
        "top_p": 1,
        "stream": True,
        "metadata": {"user_id": "u-1"},
    }
    assert convert(max_output_tokens=50)["max_tokens"] == 50


def test_codex_like_conversation_with_calls_outputs_and_reasoning_summaries() -> None:
    out = convert(
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}], "encrypted_content": None},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "looking"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": PATCH},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Done"}]},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert out["system"] == [{"type": "text", "text": "rules"}]
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "looking"},
                {"type": "tool_use", "id": "c1", "name": "shell", "input": {"cmd": ["ls"]}},
                {"type": "tool_use", "id": "c2", "name": "apply_patch__freeform", "input": {"input": PATCH}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "a.txt"},
                {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "Done"}]},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


def test_images_and_files() -> None:
    pdf, text = "data:application/pdf;base64,JVBERi0=", "data:text/plain;base64," + base64.b64encode(b"notes").decode()
    parts = [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "high"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
        {"type": "input_file", "file_data": pdf, "filename": "a.pdf"},
        {"type": "input_file", "file_data": text},
        {"type": "input_file", "file_url": "https://example.com/b.pdf"},
    ]
    assert convert(input=[{"role": "user", "content": parts}])["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}, "title": "a.pdf"},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}},
    ]


def test_tools_custom_tools_and_tool_choice() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: PATCH"}
    tools = [
        {"type": "function", "name": "shell", "description": "run", "parameters": {"type": "object"}, "strict": False},
        {"type": "custom", "name": "apply_patch", "description": "edit files", "format": grammar},
    ]
    out = convert(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"}, parallel_tool_calls=False)
    assert out["tools"][0] == {"name": "shell", "input_schema": {"type": "object"}, "description": "run"}
    custom = out["tools"][1]
    assert custom["name"] == "apply_patch__freeform" and custom["input_schema"]["required"] == ["input"]
    assert custom["description"].startswith("edit files") and "lark grammar:\nstart: PATCH" in custom["description"]
    assert out["tool_choice"] == {"type": "tool", "name": "apply_patch__freeform", "disable_parallel_tool_use": True}
    assert convert(tools=tools[:1], tool_choice="required")["tool_choice"] == {"type": "any"}
    assert convert(tools=tools[:1], tool_choice={"type": "function", "name": "shell"})["tool_choice"] == {"type": "tool", "name": "shell"}
    assert convert(tool_choice="none", parallel_tool_calls=False)["tool_choice"] == {"type": "none"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, r"tools\[0\]: tool type \"web_search\""),
        ({"tools": [{"type": "namespace", "name": "mcp", "description": "", "tools": []}]}, r"tools\[0\]: tool type \"namespace\""),
        ({"tools": [{"type": "tool_search"}]}, "tool_search"),
        ({"tools": [{"type": "function", "name": "f__freeform", "parameters": {}}]}, r"tools\[0\]\.name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {}, "defer_loading": True}]}, "defer_loading"),
        ({"input": [{"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"}]}, r"input\[0\]\.encrypted_content"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, r"input\[0\]\.call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{bad"}]}, r"input\[0\]\.arguments"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, r"input\[0\]\.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "file_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "file_id"),
        ({"input": [{"role": "user", "content": "a"}, {"role": "developer", "content": "late"}]}, r"input\[1\]: a system or developer"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"temperature": 1.5}, "temperature"),
        ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
        ({"truncation": "auto"}, "truncation"),
    ],
)
def test_refusals_name_their_field(body: dict, message: str) -> None:
    with pytest.raises(GatewayError, match=message):
        convert(**body)


def test_response_with_text_function_and_custom_calls() -> None:
    message = {
        "id": "msg_01",
        "model": "claude",
        "content": [
            {"type": "thinking", "thinking": "hidden", "signature": "s"},
            {"type": "text", "text": "Patching."},
            {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": ["ls"]}},
            {"type": "tool_use", "id": "toolu_2", "name": "apply_patch__freeform", "input": {"input": PATCH}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20},
    }
    response = sdk_response(translator.convert_response(message, created=7))
    assert response.id == "resp_01" and response.status == "completed" and response.created_at == 7
    assert response.output_text == "Patching."
    call, custom = response.output[1], response.output[2]
    assert call.type == "function_call" and call.call_id == "toolu_1" and json.loads(call.arguments) == {"cmd": ["ls"]}
    assert custom.type == "custom_tool_call" and custom.name == "apply_patch" and custom.input == PATCH and custom.call_id == "toolu_2"
    assert response.usage.input_tokens == 130 and response.usage.input_tokens_details.cached_tokens == 100
    assert response.usage.output_tokens == 5 and response.usage.total_tokens == 135


def test_response_cut_by_the_output_limit_is_incomplete() -> None:
    message = {"id": "msg_2", "model": "m", "content": [{"type": "text", "text": "a"}], "stop_reason": "max_tokens", "usage": {}}
    response = sdk_response(translator.convert_response(message, created=1))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_stream_of_text_and_tool_calls_parses_with_the_sdk() -> None:
    reply = Reply(text="Hello there, world", tool_calls=(ToolCall("shell", {"cmd": ["ls", "-la"]}, "toolu_a"),), input_tokens=42, output_tokens=9)
    upstream = fake.events("msg_abc", "claude", reply)
    events, final = sdk_stream(translated_stream(translator.StreamConverter(True, 5), upstream))
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"] and events[-1].type == "response.completed"
    assert "".join(of_type(events, "response.output_text.delta", "delta")) == "Hello there, world"
    assert json.loads("".join(of_type(events, "response.function_call_arguments.delta", "delta"))) == {"cmd": ["ls", "-la"]}
    assert final.id == "resp_abc" and final.output_text == "Hello there, world"
    assert final.output[1].type == "function_call" and final.output[1].call_id == "toolu_a" and final.output[1].name == "shell"
    assert final.usage.input_tokens == 42 and final.usage.output_tokens == 9 and final.usage.total_tokens == 51


def test_stream_of_a_custom_tool_call_gives_the_raw_input() -> None:
    reply = Reply(text="", tool_calls=(ToolCall("apply_patch__freeform", {"input": PATCH}, "toolu_p"),))
    events, final = sdk_stream(translated_stream(translator.StreamConverter(True, 5), fake.events("msg_p", "claude", reply)))
    assert of_type(events, "response.custom_tool_call_input.done", "input") == [PATCH]
    [item] = final.output
    assert item.type == "custom_tool_call" and item.name == "apply_patch" and item.input == PATCH and item.call_id == "toolu_p"


def test_stream_cut_by_the_output_limit_ends_incomplete() -> None:
    upstream = [
        encode({"type": "message_start", "message": {"id": "msg_x", "model": "m", "usage": {"input_tokens": 3}}}, "message_start"),
        encode({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}, "content_block_start"),
        encode({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}, "content_block_delta"),
        encode({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        encode({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        encode({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "par"}}, "content_block_delta"),
        encode({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 2}}, "message_delta"),
        encode({"type": "message_stop"}, "message_stop"),
    ]
    raw = translated_stream(translator.StreamConverter(True, 5), upstream)
    assert b"event: response.incomplete\n" in raw and b"response.completed" not in raw
    events, final = sdk_stream(raw)
    assert final is None
    assert events[-1].response.incomplete_details.reason == "max_output_tokens" and events[-1].response.output[0].content[0].text == "par"


def test_finish_closes_what_the_provider_left_open() -> None:
    converter = translator.StreamConverter(True, 5)
    upstream = fake.events("msg_f", "claude", Reply(text="abc"))[:4]  # message_start, ping, block start, first delta
    events, final = sdk_stream(translated_stream(converter, upstream))
    assert final.output_text == "a" and events[-1].type == "response.completed"
