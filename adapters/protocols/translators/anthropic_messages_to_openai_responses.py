"""An Anthropic Messages client (Claude Code, the ``anthropic`` SDK) served by an OpenAI
Responses provider.

Converts ``system`` (``instructions``), user text, images (base64 as a data URL, or by
URL), PDF documents (base64 or by URL, as ``input_file``), assistant text, ``tool_use``
and ``tool_result`` (``function_call`` / ``function_call_output``, paired by the tool use
id; a result's text and images travel as they are, one marked ``is_error`` starts with
``[tool error]``: Responses has no error flag), custom tools (function tools),
``tool_choice`` (with ``disable_parallel_tool_use``), ``max_tokens`` (at most the
target's ceiling), ``temperature``, ``top_p`` and ``stream``. Nothing is stored at the
provider (``store: false``): each request carries the whole conversation.

Dropped, as changes of cost rather than meaning: ``cache_control`` markers, ``metadata``
(never read by the model), ``thinking: disabled`` and earlier turns' ``thinking`` /
``redacted_thinking`` blocks (Anthropic's signed reasoning, which no OpenAI model can
read; Anthropic itself leaves earlier turns' thinking out of the context). Answers'
reasoning items are dropped too: unsigned ``thinking`` blocks would be refused when the
client replays them to Anthropic, and no thinking was asked for (their tokens stay in
``output_tokens``).

Refused with a 400 naming the field: ``thinking`` enabled (a budget of thinking tokens
returned as signed blocks has no Responses equivalent), ``stop_sequences`` (Responses
has no stop), server tools (they run at Anthropic), documents other than PDF, citations
and document context, and every other member or block without an equivalent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.adapters.protocols.translators.responses_events import base_id
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "an OpenAI Responses provider"

_CONVERTED = {"model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "tools", "tool_choice", "metadata"}
_INCOMPLETE = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or value is None:
            continue
        if name == "thinking" and isinstance(value, dict) and value.get("type") == "disabled":
            continue
        if name == "stop_sequences" and value == []:
            continue
        raise invalid(f"{name}: cannot be converted for {TARGET}")
    items: list[dict[str, Any]] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise invalid("messages: expected an array")
    for i, message in enumerate(messages):
        items.extend(_message(message, f"messages[{i}]"))
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid("max_tokens: expected a positive integer")
    out: dict[str, Any] = {"model": target.model, "input": items, "max_output_tokens": min(max_tokens, target.max_output_tokens), "store": False}
    system = body.get("system")
    if system:
        out["instructions"] = _system(system)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if stream:
        out["stream"] = True
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise invalid("tools: expected an array")
        out["tools"] = [_tool(i, tool) for i, tool in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        out.update(_tool_choice(body["tool_choice"]))
    return out


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise invalid("system: expected a string or an array of text blocks")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"system[{j}]: only text blocks can be converted for {TARGET}")
        texts.append(_text_of(block, f"system[{j}]"))
    return "\n\n".join(texts)


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        raise invalid(f"{where}: expected an object")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role: {excerpt(role)} cannot be converted for {TARGET}")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or an array of content blocks")
    return _user_turn(content, where) if role == "user" else _assistant_turn(content, where)


def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    # Items keep the blocks' order; consecutive content blocks make one user message.
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            if parts:
                items.append({"type": "message", "role": "user", "content": parts})
                parts = []
            items.append(_tool_result(block, at))
        elif kind in ("text", "image", "document"):
            parts.append(_user_part(block, at))
        else:
            raise invalid(f"{at}: block type {excerpt(kind)} cannot be converted for {TARGET}")
    if parts:
        items.append({"type": "message", "role": "user", "content": parts})
    return items


def _user_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "input_text", "text": _text_of(block, where)}
    if kind == "image":
        return {"type": "input_image", "image_url": _source_url(block.get("source"), "image/", where), "detail": "auto"}
    for name in ("citations", "context"):
        if block.get(name) and not (name == "citations" and isinstance(block[name], dict) and block[name].get("enabled") is False):
            raise invalid(f"{where}.{name}: cannot be converted for {TARGET}")
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "url":
        return {"type": "input_file", "file_url": _source_url(source, "application/pdf", where)}
    filename = block["title"] if isinstance(block.get("title"), str) and block["title"] else "document.pdf"
    return {"type": "input_file", "filename": filename, "file_data": _source_url(source, "application/pdf", where)}


def _source_url(source: Any, media: str, where: str) -> str:
    """The source as a URL: its own, or a data URL of base64 data of the ``media`` type."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url" and isinstance(source.get("url"), str):
        return source["url"]
    if kind == "base64" and isinstance(source.get("data"), str) and str(source.get("media_type", "")).startswith(media):
        return f"data:{source['media_type']};base64,{source['data']}"
    allowed = "images" if media == "image/" else "PDF documents"
    raise invalid(f"{where}.source: only base64 or URL {allowed} can be converted for {TARGET}")


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content")
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid(f"{where}.tool_use_id: expected a string")
    if content is None or isinstance(content, str):
        output: str | list[dict[str, Any]] = content or ""
    elif isinstance(content, list):
        parts = []
        for k, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind not in ("text", "image"):
                raise invalid(f"{where}.content[{k}]: only text and images in tool results can be converted for {TARGET}")
            parts.append(_user_part(item, f"{where}.content[{k}]"))
        # Text alone is a string, as a tool's output usually is.
        output = "".join(p["text"] for p in parts) if all(p["type"] == "input_text" for p in parts) else parts
    else:
        raise invalid(f"{where}.content: expected a string or an array of blocks")
    if block.get("is_error"):
        flag = "[tool error]"
        output = f"{flag} {output}" if isinstance(output, str) else [{"type": "input_text", "text": flag}, *output]
    return {"type": "function_call_output", "call_id": block["tool_use_id"], "output": output}


def _assistant_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": _text_of(block, at)}]})
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid(f"{at}: a tool use needs a string id and name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            items.append({"type": "function_call", "call_id": block["id"], "name": block["name"], "arguments": arguments})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise invalid(f"{at}: block type {excerpt(kind)} cannot be converted for {TARGET}")
    return items


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text: expected a string")
    return text


def _tool(i: int, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"), str):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise invalid(f"tools[{i}]: {excerpt(kind)}: only custom tools can be converted for {TARGET} (server tools run at Anthropic)")
    converted: dict[str, Any] = {
        "type": "function",
        "name": tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        "strict": False,  # Anthropic does not constrain a tool's input to its schema
    }
    if tool.get("description"):
        converted["description"] = tool["description"]
    return converted


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapping = {"auto": "auto", "any": "required", "none": "none"}
    if kind in mapping:
        converted: dict[str, Any] = {"tool_choice": mapping[kind]}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        converted = {"tool_choice": {"type": "function", "name": choice["name"]}}
    else:
        raise invalid(f"tool_choice: cannot be converted for {TARGET}")
    if choice.get("disable_parallel_tool_use"):
        converted["parallel_tool_calls"] = False
    return converted


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    if document.get("status") == "failed":
        raise GatewayError(ErrorKind.UPSTREAM, "the provider reported the response failed")
    content: list[dict[str, Any]] = []
    refused = False
    for item in document.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "refusal":
                    refused = True
                    content.append({"type": "text", "text": part.get("refusal") or ""})
                elif part.get("type") == "output_text":
                    content.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "function_call":
            content.append({"type": "tool_use", "id": item.get("call_id"), "name": item.get("name"), "input": _arguments(item.get("arguments"))})
        elif kind != "reasoning":  # reasoning is dropped (module docstring)
            raise GatewayError(ErrorKind.UPSTREAM, f"the provider returned a {excerpt(kind)} item, which Messages cannot express")
    reason = (document.get("incomplete_details") or {}).get("reason") if document.get("status") == "incomplete" else None
    return {
        "id": _message_id(document.get("id")),
        "type": "message",
        "role": "assistant",
        "model": document.get("model"),
        "content": content,
        "stop_reason": _stop_reason(reason, refused, any(b["type"] == "tool_use" for b in content)),
        "stop_sequence": None,
        "usage": _usage(document.get("usage") or {}),
    }


def _stop_reason(incomplete: Any, refused: bool, called: bool) -> str:
    if incomplete:
        return _INCOMPLETE.get(incomplete, "max_tokens")
    return "refusal" if refused else "tool_use" if called else "end_turn"


def _arguments(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        raise GatewayError(ErrorKind.UPSTREAM, "the provider returned tool arguments that are not valid JSON") from None
    if not isinstance(value, dict):
        raise GatewayError(ErrorKind.UPSTREAM, "the provider returned tool arguments that are not a JSON object")
    return value


def _message_id(upstream_id: Any) -> str:
    return f"msg_{base_id(upstream_id)}"


def _usage(usage: Mapping[str, Any]) -> dict[str, int]:
    cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": int(usage.get("input_tokens") or 0) - cached,
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


class StreamConverter:
    """Responses stream events in, Messages stream events out: one content block per
    message part or function call, in the order the provider sends them."""

    def __init__(self, include_usage: bool, created: int) -> None:
        # A Messages stream always reports usage; include_usage changes nothing.
        self._started = False
        self._ended = False
        self._open: str | None = None  # the open block's Responses item id
        self._open_kind = ""  # "text" or "tool"
        self._sent = ""  # the open block's text or arguments so far
        self._next_block = 0
        self._refused = False
        self._called = False

    def feed(self, event: SSEEvent) -> list[bytes]:
        kind = event.event
        if kind in (None, "error", "response.failed") or self._ended:
            return []  # an error is the gateway's to report, in the client's shape
        data = event.json()
        out = self._start(data.get("response") or {})
        item = data.get("item") or {}
        if kind == "response.output_item.added" and item.get("type") == "function_call":
            self._called = True
            block = {"type": "tool_use", "id": item.get("call_id"), "name": item.get("name"), "input": {}}
            out += self._open_block(item.get("id"), "tool", block)
        elif kind == "response.output_item.added" and item.get("type") not in ("message", "reasoning"):
            raise GatewayError(ErrorKind.UPSTREAM, f"the provider streamed a {excerpt(item.get('type'))} item, which Messages cannot express")
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            self._refused |= kind == "response.refusal.delta"
            out += self._text(data.get("item_id"), data.get("delta") or "")
        elif kind in ("response.output_text.done", "response.refusal.done"):
            # A provider that sends no deltas still sends the whole text here.
            whole = data.get("text") if kind == "response.output_text.done" else data.get("refusal")
            if not (self._open == data.get("item_id") and self._sent) and whole:
                self._refused |= kind == "response.refusal.done"
                out += self._text(data.get("item_id"), whole)
            out += self._close()
        elif kind == "response.function_call_arguments.delta" and self._open == data.get("item_id"):
            out += self._json(data.get("delta") or "")
        elif kind == "response.output_item.done" and item.get("type") == "function_call" and self._open == item.get("id"):
            if not self._sent:
                out += self._json(item.get("arguments") or "")
            out += self._close()
        elif kind in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            reason = (response.get("incomplete_details") or {}).get("reason") if kind == "response.incomplete" else None
            out += self._end(_stop_reason(reason, self._refused, self._called), response.get("usage") or {})
        return out

    def finish(self) -> list[bytes]:
        return self._end(_stop_reason(None, self._refused, self._called), {}) if self._started else []

    def _start(self, response: Mapping[str, Any]) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message = {
            "id": _message_id(response.get("id")),
            "type": "message",
            "role": "assistant",
            "model": response.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Responses reports input tokens only at the end: message_delta carries them.
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [encode({"type": "message_start", "message": message}, "message_start")]

    def _open_block(self, item_id: Any, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._open, self._open_kind, self._sent = str(item_id or ""), kind, ""
        out.append(encode({"type": "content_block_start", "index": self._next_block, "content_block": block}, "content_block_start"))
        return out

    def _text(self, item_id: Any, text: str) -> list[bytes]:
        out = [] if self._open == item_id and self._open_kind == "text" else self._open_block(item_id, "text", {"type": "text", "text": ""})
        if text:
            self._sent += text
            out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def _json(self, partial: str) -> list[bytes]:
        if not partial:
            return []
        self._sent += partial
        return [self._delta({"type": "input_json_delta", "partial_json": partial})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return encode({"type": "content_block_delta", "index": self._next_block, "delta": delta}, "content_block_delta")

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        out = [encode({"type": "content_block_stop", "index": self._next_block}, "content_block_stop")]
        self._next_block += 1
        return out

    def _end(self, stop_reason: str, usage: Mapping[str, Any]) -> list[bytes]:
        if self._ended:
            return []
        self._ended = True
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": _usage(usage)}
        return [*self._close(), encode(delta, "message_delta"), encode({"type": "message_stop"}, "message_stop")]
