"""Chat client → Responses provider: the translator on its own, its answers and streams
read back with the ``openai`` SDK's Chat types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from portcullis.adapters.protocols.sse import SSEParser
from portcullis.adapters.protocols.translators import openai_chat_to_openai_responses as translator
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target
from tests.fakes import Reply, ToolCall
from tests.fakes.openai_responses import events, output_items, response

TARGET = Target("gpt-5", "openai", "gpt-5-2025-08-07", "us-east-1", 1, 400000, 128000, ("tools",))
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {}}}}


def convert(**body: Any) -> dict[str, Any]:
    document = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return translator.convert_request(document, TARGET, bool(document.get("stream")))


def test_defaults_never_store_and_leave_the_limit_to_the_gateway() -> None:
    out = convert()
    assert out == {"model": TARGET.model, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "store": False}


def test_sampling_limits_and_shared_members() -> None:
    out = convert(temperature=1.5, top_p=0.9, user="u", safety_identifier="s", metadata={"k": "v"}, service_tier="flex", prompt_cache_key="c", n=1, store=False)
    assert (out["temperature"], out["top_p"], out["user"], out["safety_identifier"]) == (1.5, 0.9, "u", "s")
    assert (out["metadata"], out["service_tier"], out["prompt_cache_key"]) == ({"k": "v"}, "flex", "c")
    assert convert(max_tokens=50)["max_output_tokens"] == 50
    assert convert(max_completion_tokens=70, max_tokens=50)["max_output_tokens"] == 70


def test_stream_and_its_options() -> None:
    out = convert(stream=True, stream_options={"include_usage": True})
    assert out["stream"] is True and "stream_options" not in out  # a Responses stream always ends with usage
    with pytest.raises(GatewayError, match=r"stream_options\.other"):
        convert(stream=True, stream_options={"other": 1})


def test_leading_system_message_is_the_instructions_and_later_ones_stay_in_place() -> None:
    out = convert(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": "now formal"},
        ]
    )
    assert out["instructions"] == "be brief"
    assert out["input"][1] == {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "now formal"}]}


def test_user_images_and_files() -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}},
    ]
    (item,) = convert(messages=[{"role": "user", "content": parts}])["input"]
    assert item["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"},
    ]


def test_assistant_text_tool_calls_and_results_pair_by_call_id() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    out = convert(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "checking", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
            {"role": "assistant", "content": None, "refusal": "no more"},
        ]
    )
    assert out["input"][1:] == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no more"}]},
    ]


def test_tools_are_flat_and_strict_is_stated() -> None:
    strict = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    out = convert(tools=[WEATHER, strict, {"type": "function", "function": {"name": "g"}}], parallel_tool_calls=False)
    assert out["tools"] == [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}, "strict": False, "description": "Weather"},
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
        {"type": "function", "name": "g", "parameters": {"type": "object", "properties": {}}, "strict": False},
    ]
    assert out["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", "auto"), ("none", "none"), ("required", "required"), ({"type": "function", "function": {"name": "f"}}, {"type": "function", "name": "f"})],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    assert convert(tools=[WEATHER], tool_choice=choice)["tool_choice"] == expected


def test_response_format_verbosity_and_reasoning_effort() -> None:
    schema = {"name": "answer", "schema": {"type": "object"}, "strict": True}
    out = convert(response_format={"type": "json_schema", "json_schema": schema}, verbosity="low", reasoning_effort="high")
    assert out["text"] == {"format": {"type": "json_schema", **schema}, "verbosity": "low"}
    assert out["reasoning"] == {"effort": "high"}
    assert convert(response_format={"type": "json_object"})["text"] == {"format": {"type": "json_object"}}
    assert "text" not in convert(response_format={"type": "text"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": ["x"]}, "stop"),
        ({"seed": 1}, "seed"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"store": True}, "store"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"tools": [{"type": "custom", "custom": {"name": "patch"}}]}, r"tools\[0\]"),
        ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, r"tools\[0\]\.function\.extra"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, r"messages\[0\]\.content\[0\]"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, r"messages\[0\]\.name"),
        ({"messages": [{"role": "assistant", "audio": {"id": "a"}}]}, r"messages\[0\]\.audio"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, r"messages\[0\]\.name"),
        ({"messages": [{"role": "function", "content": "x"}]}, r"messages\[0\]\.role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, r"messages\[0\]\.tool_call_id"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}, r"image_url\.url"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}]}, r"tool_calls\[0\]"),
    ],
)
def test_each_refusal_names_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError, match=field) as refused:
        convert(**body)
    assert refused.value.kind == ErrorKind.INVALID_REQUEST


# --- answers -----------------------------------------------------------------------


def _document(reply: Reply, status: str = "completed", **extra: Any) -> dict[str, Any]:
    payload = {"model": "gpt-5-2025-08-07", "input": "hi"}
    return {**response("resp_abc", payload, output_items(reply, payload), reply, status), **extra}


def test_response_text_usage_and_reasoning_left_out() -> None:
    reply = Reply(text="Hello.", reasoning="thinking", input_tokens=10, cache_read_tokens=4, output_tokens=7)
    document = _document(reply)
    document["usage"]["output_tokens_details"]["reasoning_tokens"] = 3
    completion = ChatCompletion.model_validate(translator.convert_response(document, created=5))
    assert completion.id == "chatcmpl-abc" and completion.created == 5 and completion.model == "gpt-5-2025-08-07"
    (choice,) = completion.choices
    assert choice.message.content == "Hello." and choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (14, 7, 21)
    assert completion.usage.prompt_tokens_details and completion.usage.prompt_tokens_details.cached_tokens == 4
    assert completion.usage.completion_tokens_details and completion.usage.completion_tokens_details.reasoning_tokens == 3


def test_response_tool_calls_keep_their_call_ids() -> None:
    reply = Reply(text="", tool_calls=(ToolCall("get_weather", {"city": "Oslo"}, id="call_7"),))
    completion = ChatCompletion.model_validate(translator.convert_response(_document(reply), created=1))
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id == "call_7" and call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}


def test_incomplete_response_reads_as_length_and_missing_usage_as_unknown() -> None:
    document = _document(Reply(text="cut", reports_usage=False), status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    completion = translator.convert_response(document, created=1)
    assert completion["choices"][0]["finish_reason"] == "length" and completion["usage"] is None
    document["incomplete_details"] = {"reason": "content_filter"}
    assert translator.convert_response(document, created=1)["choices"][0]["finish_reason"] == "content_filter"


def test_refusal_part_becomes_the_message_refusal() -> None:
    document = _document(Reply(text=""))
    document["output"] = [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "refusal", "refusal": "No."}]}]
    message = ChatCompletion.model_validate(translator.convert_response(document, created=1)).choices[0].message
    assert message.refusal == "No." and message.content is None


def test_custom_tool_call_answer_cannot_be_expressed() -> None:
    reply = Reply(text="", tool_calls=(ToolCall("apply_patch", {}, raw="*** Begin Patch"),))
    with pytest.raises(GatewayError, match="custom_tool_call") as failed:
        translator.convert_response(_document(reply), created=1)
    assert failed.value.kind == ErrorKind.UPSTREAM


# --- streams -----------------------------------------------------------------------


def _stream(upstream: list[bytes], include_usage: bool = True) -> tuple[list[ChatCompletionChunk], bytes]:
    converter = translator.StreamConverter(include_usage, 9)
    out = b"".join(b"".join(converter.feed(event)) for event in SSEParser().feed(b"".join(upstream))) + b"".join(converter.finish())
    parsed = list(SSEParser().feed(out))
    assert parsed[-1].data == "[DONE]" and all(event.event is None for event in parsed)
    return [ChatCompletionChunk.model_validate(json.loads(event.data)) for event in parsed[:-1]], out


def _upstream(reply: Reply) -> list[bytes]:
    payload = {"model": "gpt-5-2025-08-07", "input": "hi", "stream": True}
    return events("resp_abc", payload, output_items(reply, payload), reply)


def _text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_stream_text_with_reasoning_and_usage() -> None:
    chunks, _ = _stream(_upstream(Reply(text="Hello there, friend.", reasoning="let me think", input_tokens=10, output_tokens=5)))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].id == "chatcmpl-abc" and chunks[0].created == 9
    assert _text(chunks) == "Hello there, friend."
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, chunks[-1].usage.total_tokens) == (10, 5, 15)


def test_stream_without_include_usage_has_no_usage_chunk() -> None:
    chunks, _ = _stream(_upstream(Reply(text="hi")), include_usage=False)
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_stream_tool_calls_assemble_by_index() -> None:
    calls = (ToolCall("get_weather", {"city": "Oslo"}, id="call_1"), ToolCall("get_time", {"zone": "CET"}, id="call_2"))
    chunks, _ = _stream(_upstream(Reply(text="Let me check.", tool_calls=calls, pieces=4)))
    assembled: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = assembled.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
    assert _text(chunks) == "Let me check."
    assert [(a["id"], a["name"], json.loads(a["arguments"])) for a in assembled.values()] == [
        ("call_1", "get_weather", {"city": "Oslo"}),
        ("call_2", "get_time", {"zone": "CET"}),
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_stream_incomplete_ends_with_length() -> None:
    upstream = _upstream(Reply(text="cut short"))
    (ended,) = SSEParser().feed(upstream[-1])
    last = json.loads(ended.data)
    last.update(type="response.incomplete")
    last["response"].update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    upstream[-1] = f"event: response.incomplete\ndata: {json.dumps(last)}\n\n".encode()
    chunks, _ = _stream(upstream)
    assert _text(chunks) == "cut short"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_stream_text_sent_only_when_done_still_arrives_once() -> None:
    upstream = [e for e in _upstream(Reply(text="whole")) if b"output_text.delta" not in e]
    chunks, _ = _stream(upstream)
    assert _text(chunks) == "whole"
    chunks, _ = _stream(_upstream(Reply(text="twice?")))
    assert _text(chunks) == "twice?"


def test_stream_cut_before_its_end_makes_up_no_finish() -> None:
    converter = translator.StreamConverter(True, 1)
    out = b"".join(b"".join(converter.feed(e)) for e in SSEParser().feed(b"".join(_upstream(Reply(text="part"))[:-1])))
    assert converter.finish() == [] and b"finish_reason\":\"" not in out and b"[DONE]" not in out


def test_stream_custom_tool_call_cannot_be_expressed() -> None:
    upstream = _upstream(Reply(text="", tool_calls=(ToolCall("apply_patch", {}, raw="*** Begin Patch"),)))
    with pytest.raises(GatewayError, match="custom_tool_call") as failed:
        _stream(upstream)
    assert failed.value.kind == ErrorKind.UPSTREAM
