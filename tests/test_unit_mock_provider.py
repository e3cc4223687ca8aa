"""The built-in mock provider's shell-call rule, read by the SDKs: asked in so many words
to run a command with a shell tool on offer, it answers with a call to that tool in each
protocol, JSON and stream; the turn carrying the result, a prompt left in the history and
a request without a shell tool get text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from portcullis.adapters.protocols.sse import SSEParser
from portcullis.adapters.providers.mock import MockProvider

PROMPT = "Run the shell command `echo portcullis-ok` and report what it printed."
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
CHAT_SHELL = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


def _answer(path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    answer = asyncio.run(MockProvider("mock").send(path, "", {}, body))
    return answer.status, asyncio.run(answer.read(1 << 20)), dict(answer.headers)


def _openai() -> openai.OpenAI:
    """The mock provider answering as the gateway addresses it: OpenAI paths without the base URL's /v1."""

    def handler(request: httpx.Request) -> httpx.Response:
        status, body, headers = _answer(request.url.path.removeprefix("/v1"), request.content)
        return httpx.Response(status, content=body, headers=headers)

    return openai.OpenAI(api_key="k", base_url="http://mock/v1", http_client=httpx.Client(transport=httpx.MockTransport(handler)), max_retries=0)


def _anthropic() -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        status, body, headers = _answer(request.url.path, request.content)
        return httpx2.Response(status, content=body, headers=headers)

    return anthropic.Anthropic(api_key="k", base_url="http://mock", http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), max_retries=0)


def _raw_events(path: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    answer = asyncio.run(MockProvider("mock").send(path, "", {}, json.dumps({**request, "stream": True}).encode()))
    assert answer.headers["content-type"] == "text/event-stream"
    events = SSEParser().feed(asyncio.run(answer.read(1 << 20)))
    return [json.loads(event.data) for event in events if event.data != "[DONE]"]


# --- Responses -------------------------------------------------------------------------


def test_responses_answers_a_shell_prompt_with_a_function_call() -> None:
    response = _openai().responses.create(model="gpt-5.5", input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
                                          tools=[EXEC])
    [call] = response.output
    assert call.type == "function_call" and call.name == "exec_command" and json.loads(call.arguments) == {"cmd": "echo portcullis-ok"}
    assert call.id is not None and call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"


def test_responses_streams_the_function_call_arguments() -> None:
    request = {"model": "gpt-5.5", "input": PROMPT, "tools": [EXEC]}
    raw = _raw_events("/responses", request)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for number, event in enumerate(raw):
        assert event["sequence_number"] == number
        adapter.validate_python(event)
    deltas = "".join(e["delta"] for e in raw if e["type"] == "response.function_call_arguments.delta")
    [done] = [e for e in raw if e["type"] == "response.function_call_arguments.done"]
    assert deltas == done["arguments"] == json.dumps({"cmd": "echo portcullis-ok"})
    with _openai().responses.stream(model="gpt-5.5", input=PROMPT, tools=[EXEC]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" not in types and types[-1] == "response.completed"
    assert final.output[0].type == "function_call" and json.loads(final.output[0].arguments) == {"cmd": "echo portcullis-ok"}


def test_responses_answers_the_call_output_with_text() -> None:
    turns: list[Any] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]},
        {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd": "echo portcullis-ok"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "portcullis-ok\n"},
    ]
    assert "mock provider" in _openai().responses.create(model="gpt-5.5", input=turns, tools=[EXEC]).output_text
    with _openai().responses.stream(model="gpt-5.5", input=turns, tools=[EXEC]) as stream:
        assert "mock provider" in "".join(e.delta for e in stream if e.type == "response.output_text.delta")


@pytest.mark.parametrize("turns, tools", [
    (PROMPT, []),  # no shell tool on offer
    (PROMPT, [{**EXEC, "name": "view_image"}]),
    ([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Done."}], [EXEC]),  # the prompt is history
    ("Run echo portcullis-ok", [EXEC]),  # not asked in so many words
])
def test_responses_answers_text_without_a_fresh_shell_prompt_and_tool(turns: Any, tools: list[Any]) -> None:
    [item] = _openai().responses.create(model="gpt-5.5", input=turns, tools=tools).output
    assert item.type == "message"


def test_responses_prefers_exec_command_and_gives_other_shells_a_command() -> None:
    both = [{**EXEC, "name": "bash"}, EXEC]
    assert json.loads(_openai().responses.create(model="m", input=PROMPT, tools=both).output[0].arguments) == {"cmd": "echo portcullis-ok"}
    [call] = _openai().responses.create(model="m", input=PROMPT, tools=[{**EXEC, "name": "shell_command"}]).output
    assert call.type == "function_call" and call.name == "shell_command" and json.loads(call.arguments) == {"command": "echo portcullis-ok"}


# --- Chat Completions ------------------------------------------------------------------


def test_chat_answers_a_shell_prompt_with_tool_calls() -> None:
    choice = _openai().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": PROMPT}], tools=[CHAT_SHELL]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "shell" and json.loads(call.function.arguments) == {"command": "echo portcullis-ok"}


def test_chat_streams_the_tool_call() -> None:
    raw = _raw_events("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}], "tools": [CHAT_SHELL]})
    chunks = [ChatCompletionChunk.model_validate(event) for event in raw]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    messages: Any = [{"role": "user", "content": PROMPT}]
    with _openai().chat.completions.stream(model="m", messages=messages, tools=[CHAT_SHELL]) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == {"command": "echo portcullis-ok"}


def test_chat_answers_the_tool_message_with_text() -> None:
    messages: Any = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "portcullis-ok"},
    ]
    choice = _openai().chat.completions.create(model="m", messages=messages, tools=[CHAT_SHELL]).choices[0]
    assert choice.finish_reason == "stop" and "mock provider" in (choice.message.content or "")
    with _openai().chat.completions.stream(model="m", messages=messages, tools=[CHAT_SHELL]) as stream:
        assert "mock provider" in (stream.get_final_completion().choices[0].message.content or "")


# --- Messages --------------------------------------------------------------------------


def test_messages_answers_a_shell_prompt_with_tool_use() -> None:
    message = _anthropic().messages.create(model="claude-opus-4-8", max_tokens=100, messages=[{"role": "user", "content": PROMPT}], tools=[BASH])
    [block] = message.content
    assert message.stop_reason == "tool_use" and block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.name == "Bash" and block.input == {"command": "echo portcullis-ok"}


def test_messages_streams_the_tool_use() -> None:
    request = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}], "tools": [BASH]}
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    kinds = [adapter.validate_python(event).type for event in _raw_events("/v1/messages", request)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    with _anthropic().messages.stream(model="m", max_tokens=100, messages=[{"role": "user", "content": PROMPT}], tools=[BASH]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use" and final.content[0].input == {"command": "echo portcullis-ok"}


def test_messages_answers_the_tool_result_with_text() -> None:
    messages: Any = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo portcullis-ok"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "portcullis-ok"}]},
    ]
    message = _anthropic().messages.create(model="m", max_tokens=100, messages=messages, tools=[BASH])
    assert message.stop_reason == "end_turn" and message.content[0].type == "text" and "mock provider" in message.content[0].text
    with _anthropic().messages.stream(model="m", max_tokens=100, messages=messages, tools=[BASH]) as stream:
        assert "mock provider" in "".join(stream.text_stream)
