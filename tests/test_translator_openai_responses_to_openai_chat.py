"""Responses client → Chat provider: the translator on its own, its answers and streams
read by the ``openai`` SDK itself."""

from __future__ import annotations

import json

import pytest

from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.protocols.translators import openai_responses_to_openai_chat as translator
from portcullis.engine.errors import GatewayError
from portcullis.engine.plan import Target
from tests.fakes import openai_chat as fake
from tests.fakes.behaviours import Reply, ToolCall
from tests.translator_helpers import of_type, sdk_response, sdk_stream, translated_stream

TARGET = Target("qwen", "vllm", "Qwen/Qwen3-8B", "local", 1, 32768, 8192, ("tools",))
PATCH = "*** Begin Patch\n*** Delete File: b.txt\n*** End Patch\n"


def convert(**body) -> dict:
    document = {"model": "m", "input": "hi", **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def test_plain_input_sampling_reasoning_effort_and_usage_for_metering() -> None:
    out = convert(
        instructions="be brief",
        max_output_tokens=100,
        temperature=1.2,
        top_p=0.9,
        stream=True,
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        reasoning={"effort": "low", "summary": "auto"},
        user="u-1",
    )
    assert out == {
        "model": "Qwen/Qwen3-8B",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 100,
        "temperature": 1.2,
        "top_p": 0.9,
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "low",
        "user": "u-1",
    }
    assert "max_completion_tokens" not in convert()


def test_conversation_with_calls_outputs_and_late_developer_messages() -> None:
    out = convert(
        input=[
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "looking"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":["ls"]}'},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": PATCH},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "a.txt"}]},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
            {"role": "developer", "content": [{"type": "input_text", "text": "mode changed"}]},
        ]
    )
    assert out["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        {
            "role": "assistant",
            "content": "looking",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": ["ls"]}'}},
                {"id": "c2", "type": "function", "function": {"name": "apply_patch__freeform", "arguments": json.dumps({"input": PATCH})}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "Done"},
        {"role": "system", "content": "mode changed"},
    ]


def test_images_files_tools_tool_choice_and_text_format() -> None:
    parts = [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
    ]
    schema = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}
    tools = [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": True},
        {"type": "custom", "name": "apply_patch", "description": "edit", "format": {"type": "text"}},
    ]
    out = convert(input=[{"role": "user", "content": parts}], tools=tools, tool_choice="required", parallel_tool_calls=False, text={"format": schema})
    assert out["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
    ]
    assert out["tools"][0] == {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}, "strict": True}}
    custom = out["tools"][1]["function"]
    assert custom["name"] == "apply_patch__freeform" and custom["description"] == "edit" and custom["parameters"]["required"] == ["input"]
    assert out["tool_choice"] == "required" and out["parallel_tool_calls"] is False
    assert out["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}}
    assert convert(text={"format": {"type": "json_object"}})["response_format"] == {"type": "json_object"}
    named = convert(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"})["tool_choice"]
    assert named == {"type": "function", "function": {"name": "apply_patch__freeform"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, r"tools\[0\]: tool type \"web_search\""),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "file_search"),
        ({"tools": [{"type": "namespace", "name": "mcp", "description": "", "tools": []}]}, "namespace"),
        ({"input": [{"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"}]}, r"input\[0\]\.encrypted_content"),
        ({"input": [{"type": "custom_tool_call_output", "call_id": "x", "output": "y"}]}, r"input\[0\]\.call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": "mcp"}]}, r"input\[0\]\.namespace"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://example.com/a.pdf"}]}]}, r"input\[0\]\.content\[0\]"),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "https://x/a.png"}]},
                ]
            },
            r"input\[1\]\.output\[0\]",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, r"input\[0\]\.role"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ],
)
def test_refusals_name_their_field(body: dict, message: str) -> None:
    with pytest.raises(GatewayError, match=message):
        convert(**body)


def test_response_with_reasoning_text_and_calls() -> None:
    completion = {
        "id": "chatcmpl-9",
        "model": "qwen",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "reasoning_content": "think first",
                    "content": "On it.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":["ls"]}'}},
                        {"id": "call_2", "type": "function", "function": {"name": "apply_patch__freeform", "arguments": json.dumps({"input": PATCH})}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 20},
            "completion_tokens_details": {"reasoning_tokens": 4},
        },
    }
    response = sdk_response(translator.convert_response(completion, created=3))
    assert response.id == "resp_9" and response.status == "completed" and response.output_text == "On it."
    reasoning, _, call, custom = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "think first" and reasoning.id.startswith("rs_")
    assert call.type == "function_call" and call.call_id == "call_1" and call.arguments == '{"cmd":["ls"]}'
    assert custom.type == "custom_tool_call" and custom.name == "apply_patch" and custom.input == PATCH and custom.id.startswith("ctc_")
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (50, 20, 12, 4)


def test_response_without_usage_reports_none_and_length_is_incomplete() -> None:
    completion = {"id": "chatcmpl-1", "model": "m", "choices": [{"message": {"content": "a"}, "finish_reason": "length"}]}
    response = sdk_response(translator.convert_response(completion, created=1))
    assert response.usage is None and response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_stream_of_text_and_two_tool_calls_parses_with_the_sdk() -> None:
    reply = Reply(
        text="Listing files now",
        tool_calls=(ToolCall("shell", {"cmd": ["ls"]}, "call_a"), ToolCall("apply_patch__freeform", {"input": PATCH}, "call_b")),
        input_tokens=30,
        cache_read_tokens=10,
        output_tokens=7,
    )
    raw = translated_stream(translator.StreamConverter(True, 5), fake.events("chatcmpl-s", "qwen", reply, include_usage=True))
    events, final = sdk_stream(raw)
    assert "".join(of_type(events, "response.output_text.delta", "delta")) == "Listing files now"
    assert json.loads("".join(of_type(events, "response.function_call_arguments.delta", "delta"))) == {"cmd": ["ls"]}
    assert of_type(events, "response.custom_tool_call_input.done", "input") == [PATCH]
    assert final.id == "resp_s" and [item.type for item in final.output] == ["message", "function_call", "custom_tool_call"]
    assert final.output[2].input == PATCH and final.output[2].call_id == "call_b" and final.output[1].call_id == "call_a"
    assert final.usage.input_tokens == 40 and final.usage.input_tokens_details.cached_tokens == 10 and final.usage.output_tokens == 7


def test_stream_of_reasoning_then_text_without_done_is_closed_by_finish() -> None:
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return encode({"id": "chatcmpl-r", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    upstream = [chunk({"role": "assistant", "reasoning_content": "step "}), chunk({"reasoning_content": "one"}), chunk({"content": "ok"}), chunk({}, "stop")]
    events, final = sdk_stream(translated_stream(translator.StreamConverter(True, 5), upstream))
    assert "".join(of_type(events, "response.reasoning_text.delta", "delta")) == "step one"
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == "step one" and final.output_text == "ok"
    assert final.usage is None  # the provider reported none: unknown, not zero


def test_stream_cut_by_the_output_limit_ends_incomplete() -> None:
    upstream = [encode({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": "length"}]}), b"data: [DONE]\n\n"]
    events, final = sdk_stream(translated_stream(translator.StreamConverter(True, 5), upstream))
    assert final is None and events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_interleaved_tool_calls_cannot_be_expressed() -> None:
    converter = translator.StreamConverter(True, 1)
    deltas = [
        {"index": 0, "id": "a", "function": {"name": "f"}},
        {"index": 1, "id": "b", "function": {"name": "g"}},
        {"index": 0, "function": {"arguments": "{}"}},
    ]
    upstream = [encode({"id": "c", "choices": [{"delta": {"tool_calls": [delta]}}]}) for delta in deltas]
    with pytest.raises(GatewayError, match="interleaved"):
        translated_stream(converter, upstream)


def test_refusals_stream_and_answer_as_refusal_parts() -> None:
    upstream = [encode({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"refusal": "I can't"}, "finish_reason": "stop"}]}), b"data: [DONE]\n\n"]
    events, final = sdk_stream(translated_stream(translator.StreamConverter(True, 5), upstream))
    assert of_type(events, "response.refusal.done", "refusal") == ["I can't"] and final.output[0].content[0].refusal == "I can't"
    completion = {"id": "c", "model": "m", "choices": [{"message": {"content": None, "refusal": "No."}, "finish_reason": "stop"}]}
    assert sdk_response(translator.convert_response(completion, created=1)).output[0].content[0].type == "refusal"
