"""An OpenAI Chat client served by a provider that speaks OpenAI Responses.

Converts the leading system/developer message (``instructions``) and later ones
(system/developer message items), user text, images and files, assistant text and
refusals, tool calls and their results (``function_call`` / ``function_call_output``
items, paired by ``call_id``), function tools (``strict`` stated, since Responses
defaults it to true and Chat to false), ``tool_choice``, ``parallel_tool_calls``,
``max_completion_tokens`` / ``max_tokens`` (``max_output_tokens``), ``temperature``,
``top_p``, ``response_format`` (``text.format``), ``verbosity`` (``text.verbosity``),
``reasoning_effort`` (``reasoning.effort``), ``stream`` and the members both protocols
share (``user``, ``safety_identifier``, ``metadata``, ``service_tier``,
``prompt_cache_key``). The request always goes with ``store: false``: the gateway keeps
no responses, so none can be continued.

Dropped, as cost-only: ``stream_options`` (a Responses stream always reports usage;
the client gets its usage chunk only when it asked for one). The provider's reasoning
items are not passed on (Chat answers carry no reasoning; its tokens stay in
``completion_tokens_details.reasoning_tokens``). Refused with a 400 naming the field:
``n`` above 1, ``logprobs``, ``stop``, ``seed``, ``logit_bias``, audio, predictions,
custom tools, legacy ``functions`` and every other member without an equivalent. An
answer the client's protocol cannot express (a custom or built-in tool call) is an
upstream error (``ErrorKind.UPSTREAM``), as the other translators treat an answer they
cannot convert: the request was the client's, the answer is the provider's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import client_index, invalid
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.adapters.protocols.translators import responses_events as events
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "OpenAI Responses"

_SAME = ("temperature", "top_p", "parallel_tool_calls", "user", "safety_identifier", "metadata", "service_tier", "prompt_cache_key")
_CONVERTED = {*_SAME, "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "tools", "tool_choice"}
_CONVERTED |= {"response_format", "reasoning_effort", "verbosity"}
# Members accepted only at the value that asks for nothing.
_NO_OP: dict[str, Any] = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "store": False, "modalities": ["text"]}
_MESSAGE_MEMBERS = {"role", "content", "tool_calls", "tool_call_id", "refusal"}
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or value is None:
            continue
        if name in _NO_OP and value == _NO_OP[name]:
            continue
        raise invalid(f"{name}: cannot be converted to {TARGET}")
    instructions, items = _input(body["messages"])
    out: dict[str, Any] = {"model": target.model, "input": items, "store": False}
    if instructions is not None:
        out["instructions"] = instructions
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is not None:
        out["max_output_tokens"] = limit
    for name in _SAME:
        if body.get(name) is not None:
            out[name] = body[name]
    if stream:
        out["stream"] = True
    _stream_options(body.get("stream_options"))
    text: dict[str, Any] = {}
    fmt = _text_format(body.get("response_format"))
    if fmt is not None:
        text["format"] = fmt
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        out["text"] = text
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise invalid("tools: expected an array")
        out["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    return out


def _stream_options(options: Any) -> None:
    if options is None:
        return
    if not isinstance(options, dict):
        raise invalid("stream_options: expected an object")
    unknown = set(options) - {"include_usage", "include_obfuscation"}
    if unknown:
        raise invalid(f"stream_options.{sorted(unknown)[0]}: cannot be converted to {TARGET}")


def _input(messages: Any) -> tuple[str | None, list[dict[str, Any]]]:
    if not isinstance(messages, list):
        raise invalid("messages: expected an array")
    instructions: str | None = None
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{client_index(messages, i)}]"
        if not isinstance(message, dict):
            raise invalid(f"{where}: expected an object")
        unknown = {name for name, value in message.items() if value is not None} - _MESSAGE_MEMBERS
        if unknown:
            raise invalid(f"{where}.{sorted(unknown)[0]}: cannot be converted to {TARGET}")
        role = message.get("role")
        if role in ("system", "developer"):
            texts = _texts(message.get("content"), where)
            if i == 0:
                instructions = "".join(texts)
            else:
                items.append(_message(role, [{"type": "input_text", "text": text} for text in texts]))
        elif role == "user":
            items.append(_message("user", _user_parts(message.get("content"), where)))
        elif role == "assistant":
            items.extend(_assistant(message, where))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(f"{where}.tool_call_id: field required")
            items.append({"type": "function_call_output", "call_id": call_id, "output": "".join(_texts(message.get("content"), where))})
        else:
            raise invalid(f"{where}.role: {excerpt(role)} cannot be converted to {TARGET}")
    return instructions, items


def _message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


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


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or an array of parts")
    return [_user_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]


def _user_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "input_text", "text": part["text"]}
    if kind == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else None
        if not isinstance(url, str) or not url.startswith(("https://", "http://", "data:")):
            raise invalid(f"{where}.image_url.url: expected an http(s) or data URL")
        return {"type": "input_image", "image_url": url, "detail": spec.get("detail") or "auto"}
    if kind == "file":
        spec = part.get("file")
        names = ("file_data", "file_id", "filename")
        if not isinstance(spec, dict) or set(spec) - set(names) or not any(isinstance(spec.get(n), str) for n in names[:2]):
            raise invalid(f"{where}.file: expected file_data or file_id")
        return {"type": "input_file", **{name: spec[name] for name in names if isinstance(spec.get(name), str)}}
    raise invalid(f"{where}: part type {excerpt(kind)} cannot be converted to {TARGET}")


def _assistant(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                parts.append({"type": "refusal", "refusal": part["refusal"]})
            else:
                parts.extend(_output_text(text) for text in _texts([part], f"{where}.content[{j}]"))
    elif content:
        parts.extend(_output_text(text) for text in _texts(content, where))
    if isinstance(message.get("refusal"), str):
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        items.append(_message("assistant", parts))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls: expected an array")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise invalid(f"{where}.tool_calls[{j}]: only function calls can be converted to {TARGET}")
        if not isinstance(call.get("id"), str) or not isinstance(function.get("name"), str):
            raise invalid(f"{where}.tool_calls[{j}]: expected an id and a function name")
        arguments = function.get("arguments") or "{}"
        if not isinstance(arguments, str):
            raise invalid(f"{where}.tool_calls[{j}].function.arguments: expected a string")
        items.append({"type": "function_call", "call_id": call["id"], "name": function["name"], "arguments": arguments})
    return items


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _text_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema = fmt.get("json_schema") if kind == "json_schema" else None
    if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
        raise invalid(f"response_format: {excerpt(kind)} cannot be converted to {TARGET}")
    return {"type": "json_schema", **{name: schema[name] for name in ("name", "schema", "description", "strict") if schema.get(name) is not None}}


def _tool(i: int, tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function" or not isinstance(function.get("name"), str):
        raise invalid(f"tools[{i}]: only function tools can be converted to {TARGET}")
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise invalid(f"tools[{i}].function.{sorted(unknown)[0]}: cannot be converted to {TARGET}")
    converted: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        "strict": function.get("strict") is True,
    }
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return {"type": "function", "name": function["name"]}
    raise invalid(f"tool_choice: {excerpt(choice.get('type') if isinstance(choice, dict) else choice)} cannot be converted to {TARGET}")


# --- responses ---------------------------------------------------------------------


def _untranslatable(kind: Any) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM, f"the provider answered with a {excerpt(kind)} item, which Chat cannot express")


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in document.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal") or "")
        elif kind == "function_call":
            function = {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"}
            calls.append({"id": item.get("call_id", ""), "type": "function", "function": function})
        elif kind != "reasoning":
            raise _untranslatable(kind)
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None, "refusal": "".join(refusals) or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + events.base_id(document.get("id")),
        "object": "chat.completion",
        "created": created,
        "model": document.get("model") or "",
        "choices": [{"index": 0, "message": reply, "finish_reason": _finish_reason(document, bool(calls)), "logprobs": None}],
        "usage": _chat_usage(document.get("usage")),
    }


def _finish_reason(response: Mapping[str, Any], called: bool) -> str:
    if response.get("status") == "incomplete":
        return _INCOMPLETE.get((response.get("incomplete_details") or {}).get("reason"), "length")
    return "tool_calls" if called else "stop"


def _chat_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None  # unknown, not zero
    prompt, completion = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)},
        "completion_tokens_details": {"reasoning_tokens": int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)},
    }


class StreamConverter:
    """Responses stream events in, Chat completion chunks out."""

    def __init__(self, include_usage: bool, created: int) -> None:
        self._include_usage = include_usage
        self._created = created
        self._id = ""
        self._model = ""
        self._started = False
        self._ended = False
        self._tools: dict[str, int] = {}  # function_call item id -> Chat tool call index
        self._sent: dict[str, bool] = {}  # item id (text) or call item id -> some delta went out

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self._ended or event.data == "[DONE]":
            return []
        data = event.json()
        kind = data.get("type") or event.event
        out = self._start(data.get("response") or {})
        if kind == "response.output_item.added":
            out += self._added(data.get("item") or {})
        elif kind == "response.output_text.delta":
            out += self._text(data, "content", data.get("delta"))
        elif kind == "response.refusal.delta":
            out += self._text(data, "refusal", data.get("delta"))
        elif kind == "response.output_text.done":
            out += self._text(data, "content", data.get("text"), final=True)
        elif kind == "response.refusal.done":
            out += self._text(data, "refusal", data.get("refusal"), final=True)
        elif kind == "response.function_call_arguments.delta":
            out += self._arguments(data.get("item_id"), data.get("delta"))
        elif kind == "response.function_call_arguments.done":
            out += self._arguments(data.get("item_id"), data.get("arguments"), final=True)
        elif kind in ("response.completed", "response.incomplete"):
            out += self._end(data.get("response") or {})
        return out  # reasoning, annotations and the rest have no Chat equivalent; errors are the gateway's to report

    def finish(self) -> list[bytes]:
        return []  # a stream cut before its last event is not a completion: no finish_reason is made up

    def _start(self, response: Mapping[str, Any]) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        self._id, self._model = "chatcmpl-" + events.base_id(response.get("id")), response.get("model") or ""
        return [self._chunk({"role": "assistant", "content": ""})]

    def _added(self, item: Mapping[str, Any]) -> list[bytes]:
        kind = item.get("type")
        if kind in ("message", "reasoning"):
            return []
        if kind != "function_call":
            raise _untranslatable(kind)
        index = len(self._tools)
        self._tools[item.get("id", "")] = index
        self._sent[item.get("id", "")] = bool(item.get("arguments"))
        function = {"name": item.get("name", ""), "arguments": item.get("arguments") or ""}
        return [self._chunk({"tool_calls": [{"index": index, "id": item.get("call_id", ""), "type": "function", "function": function}]})]

    def _text(self, data: Mapping[str, Any], field: str, text: Any, final: bool = False) -> list[bytes]:
        # A provider that sends only the finished text still gets its text through once.
        key = f"{data.get('item_id')}/{data.get('content_index', 0)}"
        if not isinstance(text, str) or not text or (final and self._sent.get(key)):
            return []
        self._sent[key] = True
        return [self._chunk({field: text})]

    def _arguments(self, item_id: Any, text: Any, final: bool = False) -> list[bytes]:
        index = self._tools.get(str(item_id))
        if index is None or not isinstance(text, str) or not text or (final and self._sent.get(str(item_id))):
            return []
        self._sent[str(item_id)] = True
        return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})]

    def _end(self, response: Mapping[str, Any]) -> list[bytes]:
        self._ended = True
        out = [self._chunk({}, finish_reason=_finish_reason(response, bool(self._tools)))]
        usage = _chat_usage(response.get("usage"))
        if self._include_usage and usage is not None:
            out.append(encode({**self._envelope(), "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        return out

    def _envelope(self) -> dict[str, Any]:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created, "model": self._model}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return encode({**self._envelope(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]})
