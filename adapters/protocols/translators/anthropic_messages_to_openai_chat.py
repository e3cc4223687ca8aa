"""An Anthropic Messages client served by an OpenAI-compatible Chat provider (OpenAI,
vLLM, ...).

Converts text, system blocks, images, custom tools, tool use and tool results (a
result marked ``is_error`` becomes text starting ``[tool error]``). Prompt-cache
markers have no Chat equivalent and are dropped (they change cost, not meaning), as
are earlier turns' thinking blocks (a Chat model cannot read another model's signed
reasoning). Everything else without a faithful equivalent is refused with a clear
error."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import client_index, invalid
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "an OpenAI-compatible Chat provider"

_CONVERTED = {"model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "stop_sequences", "tools", "tool_choice", "metadata"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or value is None:
            continue
        if name == "thinking" and isinstance(value, dict) and value.get("type") == "disabled":
            continue
        raise invalid(f"{name}: cannot be converted for {TARGET}")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_content(system, "system")})
    for i, message in enumerate(body["messages"]):
        messages.extend(_message(message, f"messages[{i}]"))
    out: dict[str, Any] = {"model": target.model, "messages": messages, "max_completion_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    stop = body.get("stop_sequences")
    if stop:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("stop_sequences: expected an array of strings")
        out["stop"] = list(stop)
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise invalid("metadata: expected an object")
    if metadata.get("user_id"):
        out["user"] = str(metadata["user_id"])
    if body.get("tools"):
        out["tools"] = [_tool(i, tool) for i, tool in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        out.update(_tool_choice(body["tool_choice"]))
    return out


def _text_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}: expected a string or an array of text blocks")
    parts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise invalid(f"{where}[{client_index(content, j)}]: only text blocks can be converted for {TARGET}")
        parts.append({"type": "text", "text": block["text"]})
    return parts[0]["text"] if len(parts) == 1 else parts


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        raise invalid(f"{where}: expected an object")
    role, content = message.get("role"), message.get("content")
    if role == "system":  # some agents send system turns inside messages; Chat has them too
        return [{"role": "system", "content": _text_content(content, f"{where}.content")}]
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role: {excerpt(role)} cannot be converted for {TARGET}")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or an array of content blocks")
    return _user_turn(content, where) if role == "user" else [_assistant_turn(content, where)]


def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    # Tool results answer the previous assistant turn, so they come first, as Chat
    # tool messages; the rest of the turn follows as one user message.
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, at)})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), at)}})
        elif kind == "tool_result":
            text = _tool_result_text(block.get("content"), at)
            if block.get("is_error"):  # Chat has no error flag; the model reads it in the text
                text = f"[tool error] {text}"
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        else:
            raise invalid(f"{at}: block type {excerpt(kind)} cannot be converted for {TARGET}")
    if parts:
        results.append({"role": "user", "content": parts})
    return results


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise invalid(f"{where}.content[{k}]: only text tool results can be converted for {TARGET}")
            texts.append(_text_of(block, f"{where}.content[{k}]"))
        return "".join(texts)
    raise invalid(f"{where}.content: expected a string or an array of text blocks")


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text: expected a string")
    return text


def _image_url(source: Any, where: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if isinstance(source, dict) and source.get("type") == "url":
        return str(source.get("url"))
    raise invalid(f"{where}.source: only base64 and url images can be converted for {TARGET}")


def _assistant_turn(blocks: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text_of(block, f"{where}.content[{j}]"))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append({"id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": arguments}})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise invalid(f"{where}.content[{j}]: block type {excerpt(kind)} cannot be converted for {TARGET}")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _tool(i: int, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"), str):
        raise invalid(f"tools[{i}]: only custom tools can be converted for {TARGET} (server tools run at Anthropic)")
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapping = {"auto": "auto", "any": "required", "none": "none"}
    if kind in mapping:
        converted: dict[str, Any] = {"tool_choice": mapping[kind]}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        converted = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise invalid("tool_choice: cannot be converted for " + TARGET)
    if choice.get("disable_parallel_tool_use"):
        converted["parallel_tool_calls"] = False
    return converted


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    choices = document.get("choices") or [{}]
    reply = choices[0].get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": _arguments(function.get("arguments"))})
    return {
        "id": _message_id(document.get("id")),
        "type": "message",
        "role": "assistant",
        "model": document.get("model"),
        "content": content,
        "stop_reason": _STOP_REASONS.get(choices[0].get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": _messages_usage(document.get("usage") or {}),
    }


def _arguments(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        raise GatewayError(ErrorKind.UPSTREAM, "the provider returned tool arguments that are not valid JSON") from None
    if not isinstance(value, dict):
        raise GatewayError(ErrorKind.UPSTREAM, "the provider returned tool arguments that are not a JSON object")
    return value


def _message_id(upstream_id: Any) -> str:
    text = str(upstream_id or "")
    return text if text.startswith("msg_") else f"msg_{text}"


def _messages_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


class StreamConverter:
    """Chat completion chunks in, Messages stream events out."""

    def __init__(self, include_usage: bool, created: int) -> None:
        self._started = False
        self._open: tuple[str, int] | None = None  # ("text", -1) or ("tool", chat tool index)
        self._next_block = 0
        self._closed_tools: set[int] = set()
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.data == "[DONE]":
            return self._start({}) + self._end()
        chunk = event.json()
        out = self._start(chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._switch_to(("text", -1), {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                function = call.get("function") or {}
                if self._open != ("tool", index):
                    if index in self._closed_tools:
                        raise GatewayError(ErrorKind.UPSTREAM, "the provider interleaved tool calls, which Messages cannot express")
                    block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": {}}
                    out += self._switch_to(("tool", index), block)
                if function.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def finish(self) -> list[bytes]:
        return []

    def _start(self, chunk: Mapping[str, Any]) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [encode({"type": "message_start", "message": message}, "message_start")]

    def _switch_to(self, block_key: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        if self._open == block_key:
            return []
        out = self._close()
        self._open = block_key
        out.append(encode({"type": "content_block_start", "index": self._next_block, "content_block": block}, "content_block_start"))
        return out

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        if self._open[0] == "tool":
            self._closed_tools.add(self._open[1])
        self._open = None
        out = [encode({"type": "content_block_stop", "index": self._next_block}, "content_block_stop")]
        self._next_block += 1
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return encode({"type": "content_block_delta", "index": self._next_block, "delta": delta}, "content_block_delta")

    def _end(self) -> list[bytes]:
        out = self._close()
        usage = _messages_usage(self._usage)
        out.append(
            encode(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _STOP_REASONS.get(self._finish or "stop", "end_turn"), "stop_sequence": None},
                    "usage": usage,
                },
                "message_delta",
            )
        )
        out.append(encode({"type": "message_stop"}, "message_stop"))
        return out
