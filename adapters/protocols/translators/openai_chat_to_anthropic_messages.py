"""An OpenAI Chat client served by an Anthropic Messages provider.

Converts what has a faithful equivalent (text, system/developer instructions,
images, function tools and tool calls, sampling limits) and refuses the rest with
a clear error instead of dropping it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import client_index, invalid
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.engine.errors import excerpt
from portcullis.engine.plan import Target

TARGET = "Anthropic Messages"

# Members that convert, and members accepted only at their no-op value.
_CONVERTED = {
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
}
_NO_OP = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "store": False, "response_format": {"type": "text"}}

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or value is None:
            continue
        if name in _NO_OP and value == _NO_OP[name]:
            continue
        raise invalid(f"{name}: cannot be converted to {TARGET} (the model is served by an Anthropic provider)")
    system, messages = _messages(body["messages"])
    out: dict[str, Any] = {
        "model": target.model,
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or target.max_output_tokens,
        "messages": messages,
    }
    if system:
        out["system"] = system
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise invalid(f"{name}: {TARGET} accepts values from 0 to 1")
            out[name] = value
    stop = body.get("stop")
    if stop is not None:
        if not isinstance(stop, str | list) or not all(isinstance(s, str) for s in (stop if isinstance(stop, list) else [stop])):
            raise invalid("stop: expected a string or an array of strings")
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if stream:
        out["stream"] = True
    if body.get("user"):
        out["metadata"] = {"user_id": str(body["user"])}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _messages(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{client_index(messages, i)}]"
        role = message.get("role")
        unknown = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
        if unknown:
            raise invalid(f"{where}.{sorted(unknown)[0]}: cannot be converted to {TARGET}")
        if role in ("system", "developer"):
            if turns:
                raise invalid(f"{where}: a {role} message after the conversation started cannot be converted to {TARGET}")
            system.extend({"type": "text", "text": text} for text in _texts(message.get("content"), where))
        elif role == "user":
            _append(turns, "user", _user_blocks(message.get("content"), where))
        elif role == "assistant":
            _append(turns, "assistant", _assistant_blocks(message, where))
        elif role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise invalid(f"{where}.tool_call_id: field required")
            text = "".join(_texts(message.get("content"), where))
            _append(turns, "user", [{"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": text}])
        else:
            raise invalid(f"{where}.role: {excerpt(role)} cannot be converted to {TARGET}")
    return system, turns


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # Consecutive turns of one role become one Messages turn: tool results that answer
    # one assistant turn must travel together in the next user turn.
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def _texts(content: Any, where: str) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{j}]: only text parts can be converted here")
            texts.append(part["text"])
        return texts
    raise invalid(f"{where}.content: expected a string or an array of parts")


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or an array of parts")
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), f"{where}.content[{j}]"))
        else:
            raise invalid(f"{where}.content[{j}]: part type {excerpt(kind)} cannot be converted to {TARGET}")
    return blocks


def _image(spec: Any, where: str) -> dict[str, Any]:
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        raise invalid(f"{where}.image_url.url: field required")
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header.removeprefix("data:").removesuffix(";base64")
        if not header.endswith(";base64") or not media_type.startswith("image/"):
            raise invalid(f"{where}.image_url.url: only base64 image data URLs can be converted")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise invalid(f"{where}.image_url.url: expected an http(s) or data URL")


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    content = message.get("content")
    if content:
        blocks.extend({"type": "text", "text": text} for text in _texts(content, where))
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise invalid(f"{where}.tool_calls[{j}]: only function calls can be converted")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            raise invalid(f"{where}.tool_calls[{j}].function.arguments: not valid JSON") from None
        if not isinstance(arguments, dict):
            raise invalid(f"{where}.tool_calls[{j}].function.arguments: expected a JSON object")
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
    return blocks


def _tool(i: int, tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function" or not isinstance(function.get("name"), str):
        raise invalid(f"tools[{i}]: only function tools can be converted to {TARGET}")
    converted: dict[str, Any] = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        converted = {"type": "auto"} if parallel is False else None
    elif choice in ("auto", "none"):
        converted = {"type": choice}
    elif choice == "required":
        converted = {"type": "any"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        converted = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise invalid("tool_choice: cannot be converted to " + TARGET)
    if converted is not None and parallel is False and converted["type"] != "none":
        converted["disable_parallel_tool_use"] = True
    return converted


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    text = "".join(block.get("text", "") for block in document.get("content", []) if block.get("type") == "text")
    calls = [
        {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}}
        for block in document.get("content", [])
        if block.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": document.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": document.get("model"),
        "choices": [{"index": 0, "message": reply, "finish_reason": _FINISH_REASONS.get(document.get("stop_reason"), "stop"), "logprobs": None}],
        "usage": _chat_usage(document.get("usage") or {}),
    }


def _chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class StreamConverter:
    """Messages stream events in, Chat completion chunks out."""

    def __init__(self, include_usage: bool, created: int) -> None:
        self._include_usage = include_usage
        self._created = created
        self._id = ""
        self._model = ""
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None
        self._block_tools: dict[int, int] = {}  # Messages block index -> Chat tool call index

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.event in (None, "ping", "content_block_stop"):
            return []
        data = event.json()
        if event.event == "message_start":
            message = data.get("message", {})
            self._id, self._model = message.get("id", ""), message.get("model", "")
            self._usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if event.event == "content_block_start":
            block = data.get("content_block", {})
            if block.get("type") == "tool_use":
                index = len(self._block_tools)
                self._block_tools[data.get("index", 0)] = index
                call = {"index": index, "id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": ""}}
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if event.event == "content_block_delta":
            delta = data.get("delta", {})
            if delta.get("type") == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if delta.get("type") == "input_json_delta":
                index = self._block_tools.get(data.get("index", 0), 0)
                return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": delta.get("partial_json", "")}}]})]
            return []  # thinking and signature deltas have no Chat equivalent
        if event.event == "message_delta":
            self._stop_reason = (data.get("delta") or {}).get("stop_reason") or self._stop_reason
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            return []
        if event.event == "message_stop":
            out = [self._chunk({}, finish_reason=_FINISH_REASONS.get(self._stop_reason, "stop"))]
            if self._include_usage:
                out.append(encode({**self._envelope(), "choices": [], "usage": _chat_usage(self._usage)}))
            out.append(b"data: [DONE]\n\n")
            return out
        return []

    def finish(self) -> list[bytes]:
        return []

    def _envelope(self) -> dict[str, Any]:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created, "model": self._model}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return encode({**self._envelope(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]})
