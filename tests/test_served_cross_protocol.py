"""A client of one protocol served by a provider of the other, through the SDKs."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.conftest import Fakes, GatewayProcess
from tests.fakes import Reply, ToolCall

pytestmark = pytest.mark.served

TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
]
TOOLS_ANTHROPIC = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@pytest.fixture
def chat(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)


@pytest.fixture
def messages(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)


def test_chat_client_to_messages_provider(chat: openai.OpenAI, fakes: Fakes) -> None:
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Reply(text="", tool_calls=(ToolCall("get_weather", {"city": "Seoul"}, id="toolu_1"),)))
    completion = chat.chat.completions.create(
        model="claude-sonnet-4-5",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "toolu_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Busan"}'}}],
            },
            {"role": "tool", "tool_call_id": "toolu_0", "content": "sunny"},
            {"role": "user", "content": "And Seoul?"},
        ],
        tools=TOOLS_OPENAI,
        tool_choice="required",
        max_tokens=100,
        stop="END",
    )
    sent = fakes.anthropic_us.received[0].json
    assert sent["system"] == [{"type": "text", "text": "Be brief."}]
    assert sent["messages"][1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": {"city": "Busan"}}]}
    assert sent["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"}
    assert sent["messages"][2]["content"][1] == {"type": "text", "text": "And Seoul?"}
    assert sent["tools"][0]["input_schema"]["properties"] == {"city": {"type": "string"}}
    assert sent["tool_choice"] == {"type": "any"} and sent["stop_sequences"] == ["END"] and sent["max_tokens"] == 100
    call = completion.choices[0].message.tool_calls[0]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.id == "toolu_1" and json.loads(call.function.arguments) == {"city": "Seoul"}
    assert completion.usage.prompt_tokens == 100 and completion.usage.completion_tokens == 20


def test_chat_client_streams_from_messages_provider(chat: openai.OpenAI, fakes: Fakes) -> None:
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Reply(text="Hi there", tool_calls=(ToolCall("get_weather", {"city": "Jeju"}, id="toolu_9"),)))
    chunks = list(
        chat.chat.completions.create(
            model="sonnet", messages=[{"role": "user", "content": "x"}], tools=TOOLS_OPENAI, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == "Hi there"
    assert calls[0].id == "toolu_9" and calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Jeju"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == 20


def test_messages_client_to_chat_provider(messages: anthropic.Anthropic, fakes: Fakes) -> None:
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Reply(text="Sure", tool_calls=(ToolCall("get_weather", {"city": "Seoul"}, id="call_7"),)))
    reply = messages.messages.create(
        model="gpt-4o-mini",
        max_tokens=50,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=TOOLS_ANTHROPIC,
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_0", "name": "get_weather", "input": {"city": "Busan"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0", "content": "sunny"}, {"type": "text", "text": "And Seoul?"}]},
        ],
    )
    sent = fakes.openai_main.received[0].json
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["messages"][2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Busan"}'}
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}
    assert sent["messages"][4] == {"role": "user", "content": [{"type": "text", "text": "And Seoul?"}]}
    assert sent["max_completion_tokens"] == 50 and sent["tools"][0]["function"]["name"] == "get_weather"
    assert reply.content[0].text == "Sure" and reply.content[1].input == {"city": "Seoul"} and reply.stop_reason == "tool_use"
    assert reply.usage.input_tokens == 100 and reply.usage.output_tokens == 20


def test_messages_client_streams_from_chat_provider(messages: anthropic.Anthropic, fakes: Fakes) -> None:
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Reply(text="Streaming works", tool_calls=(ToolCall("get_weather", {"city": "Daegu"}, id="call_3"),)))
    with messages.messages.stream(model="mini", max_tokens=50, messages=[{"role": "user", "content": "x"}], tools=TOOLS_ANTHROPIC) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streaming works"
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Daegu"} and final.content[1].id == "call_3"
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 20 and final.usage.input_tokens == 100
    assert fakes.openai_main.received[0].json["stream_options"] == {"include_usage": True}


def test_what_cannot_be_converted_is_refused_clearly(chat: openai.OpenAI, messages: anthropic.Anthropic, fakes: Fakes) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat.chat.completions.create(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "x"}], n=2)
    assert "n: cannot be converted" in refused.value.message
    with pytest.raises(anthropic.BadRequestError) as refused_messages:
        messages.messages.create(model="gpt-4o-mini", max_tokens=10, messages=[{"role": "user", "content": "x"}], extra_body={"top_k": 5})
    assert "top_k: cannot be converted" in refused_messages.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        messages.messages.create(
            model="gpt-4o-mini", max_tokens=10, messages=[{"role": "user", "content": "x"}], tools=[{"type": "web_search_20250305", "name": "web_search"}]
        )
    assert not fakes.anthropic_us.received and not fakes.openai_main.received


def test_line_separators_inside_streamed_text_survive_conversion(messages: anthropic.Anthropic, chat: openai.OpenAI, fakes: Fakes) -> None:
    text = "one\u2028two\u2029three\u0085four"
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Reply(text=text))
    with messages.messages.stream(model="gpt-4o-mini", max_tokens=50, messages=[{"role": "user", "content": "x"}]) as stream:
        assert "".join(stream.text_stream) == text
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Reply(text=text))
    chunks = chat.chat.completions.create(model="sonnet", messages=[{"role": "user", "content": "x"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
