"""What a Responses client gets back, built for both translators that serve one from a
foreign provider: the ``response`` object, its output items, usage, and the stream
events exactly as the ``openai`` SDK and Codex parse them (``event: <type>``, each
``data`` carrying ``type`` and a rising ``sequence_number``; the full response under
``response`` in the first and the last event).

Custom (freeform) tools have no equivalent in Messages or in most Chat servers, so
the translators offer each to the provider as a function tool named
``<name>__freeform`` that takes one string, ``input``; a call of such a tool comes back
to the client as a ``custom_tool_call`` with exactly that string as its raw ``input``.
The suffix is how a stateless answer conversion knows the call was a custom tool's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.protocols.text import ToolCall
from portcullis.engine.errors import ErrorKind, GatewayError

CUSTOM_SUFFIX = "__freeform"


def client_tool_call(call: ToolCall) -> ToolCall:
    """A provider's call as the Responses client will receive it: a freeform tool's
    wrapper function is the custom tool again, judged on ``{"input": raw}`` as a Responses
    provider's ``custom_tool_call`` is."""
    if call.name.endswith(CUSTOM_SUFFIX):
        return ToolCall(call.name.removesuffix(CUSTOM_SUFFIX), call.arguments)
    return call
CUSTOM_PROPERTY = "input"


def custom_parameters(description: str | None) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": "string", "description": description or "The raw input of the tool."}
    return {"type": "object", "properties": {CUSTOM_PROPERTY: prop}, "required": [CUSTOM_PROPERTY], "additionalProperties": False}


def custom_description(tool: Mapping[str, Any], where: str) -> str:
    """The custom tool's description, with its input grammar spelled out: the provider
    cannot constrain decoding to it, so the model reads it instead."""
    description = str(tool.get("description") or "")
    fmt = tool.get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
        raise invalid(f"{where}.format: cannot be converted")
    if fmt["type"] == "grammar":
        if not isinstance(fmt.get("definition"), str):
            raise invalid(f"{where}.format.definition: expected a string")
        syntax = fmt.get("syntax", "lark")
        description += f"\n\nThe input must match this {syntax} grammar:\n{fmt['definition']}"
    return description.strip()


def check_function_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name: expected a non-empty string")
    if name.endswith(CUSTOM_SUFFIX):
        raise invalid(f"{where}.name: a function name ending {CUSTOM_SUFFIX!r} cannot be converted (the suffix marks custom tools)")
    return name


def custom_input(arguments: Mapping[str, Any] | str) -> str:
    """The raw input of a wrapped custom tool call, from its arguments."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get(CUSTOM_PROPERTY), str):
        raise GatewayError(ErrorKind.UPSTREAM, "the provider called a custom tool without its string input")
    return value[CUSTOM_PROPERTY]


def base_id(upstream_id: Any) -> str:
    text = str(upstream_id or "")
    for prefix in ("msg_", "chatcmpl-", "resp_"):
        text = text.removeprefix(prefix)
    return text


def message_item(item_id: str, text: str, refusal: bool = False) -> dict[str, Any]:
    part = {"type": "refusal", "refusal": text} if refusal else {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    """A ``function_call`` item, or a ``custom_tool_call`` when ``name`` is a wrapped custom tool."""
    if name.endswith(CUSTOM_SUFFIX):
        raw = custom_input(arguments) if status == "completed" else ""
        if item_id.startswith("fc_"):  # OpenAI's prefix for custom tool call items
            item_id = "ctc_" + item_id.removeprefix("fc_")
        return {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name.removesuffix(CUSTOM_SUFFIX), "input": raw}
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status}


def usage(input_tokens: int, cached: int, cache_write: int, output_tokens: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def response(
    response_id: str, created: int, model: Any, output: list[dict[str, Any]], status: str, usage_: dict[str, Any] | None, reason: str | None = None
) -> dict[str, Any]:
    # The request's own settings (tools, tool_choice, ...) are not known to a stateless
    # answer conversion; the members the SDK requires get their defaults.
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
        "model": model or "",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage_,
    }


class ResponsesStream:
    """The Responses stream events, one output item open at a time."""

    def __init__(self, created: int) -> None:
        self._created = created
        self._sequence = 0
        self.response_id = ""
        self.base = ""
        self.model: Any = ""
        self.started = False
        self.ended = False
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._buffer = ""  # the open item's text, arguments or raw input so far
        self._refusal = False  # the open message is a refusal

    def event(self, kind: str, **members: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **members}
        self._sequence += 1
        return encode(data, kind)

    def start(self, upstream_id: Any, model: Any) -> list[bytes]:
        if self.started:
            return []
        self.started, self.base, self.model = True, base_id(upstream_id), model
        self.response_id = f"resp_{self.base}"
        shell = response(self.response_id, self._created, model, [], "in_progress", None)
        return [self.event("response.created", response=shell), self.event("response.in_progress", response=shell)]

    @property
    def open_kind(self) -> str | None:
        return self._open["type"] if self._open is not None else None

    @property
    def open_key(self) -> Any:
        return self._open.get("_key") if self._open is not None else None

    def _add(self, item: dict[str, Any], key: Any) -> bytes:
        self._open, self._buffer = {**item, "_key": key}, ""
        return self.event("response.output_item.added", output_index=len(self.output), item=item)

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output)}

    def open_message(self, key: Any = None, refusal: bool = False) -> list[bytes]:
        item = {"id": f"msg_{self.base}_{len(self.output)}", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        out = [*self.close(), self._add(item, key)]
        self._refusal = refusal
        part = {"type": "refusal", "refusal": ""} if refusal else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [*out, self.event("response.content_part.added", **self._where(), content_index=0, part=part)]

    @property
    def refusing(self) -> bool:
        return self.open_kind == "message" and self._refusal

    def open_reasoning(self, key: Any = None) -> list[bytes]:
        item = {"id": f"rs_{self.base}_{len(self.output)}", "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        out = [*self.close(), self._add(item, key)]
        part = {"type": "reasoning_text", "text": ""}
        return [*out, self.event("response.content_part.added", **self._where(), content_index=0, part=part)]

    def open_call(self, call_id: str, name: str, key: Any = None) -> list[bytes]:
        item = call_item(f"fc_{self.base}_{len(self.output)}", call_id, name, "", "in_progress")
        return [*self.close(), self._add(item, key)]

    def delta(self, text: str) -> list[bytes]:
        """More of the open item: text, reasoning, arguments (a custom tool's input is
        sent whole when the call closes: it arrives wrapped in JSON)."""
        if self._open is None or not text:
            return []
        self._buffer += text
        kind = self._open["type"]
        if kind == "message" and self._refusal:
            return [self.event("response.refusal.delta", **self._where(), content_index=0, delta=text)]
        if kind == "message":
            return [self.event("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=[])]
        if kind == "reasoning":
            return [self.event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]
        if kind == "function_call":
            return [self.event("response.function_call_arguments.delta", **self._where(), delta=text)]
        return []

    def close(self) -> list[bytes]:
        if self._open is None:
            return []
        where, kind, text = self._where(), self._open["type"], self._buffer
        if kind == "message":
            done = message_item(self._open["id"], text, refusal=self._refusal)
            part = done["content"][0]
            ended = (
                self.event("response.refusal.done", **where, content_index=0, refusal=text)
                if self._refusal
                else self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            )
            out = [ended, self.event("response.content_part.done", **where, content_index=0, part=part)]
        elif kind == "reasoning":
            done = reasoning_item(self._open["id"], text)
            out = [
                self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                self.event("response.content_part.done", **where, content_index=0, part=done["content"][0]),
            ]
        elif kind == "function_call":
            done = call_item(self._open["id"], self._open["call_id"], self._open["name"], text or "{}")
            out = [self.event("response.function_call_arguments.done", **where, arguments=done["arguments"])]
        else:
            done = call_item(self._open["id"], self._open["call_id"], self._open["name"] + CUSTOM_SUFFIX, text)
            out = [
                self.event("response.custom_tool_call_input.delta", **where, delta=done["input"]),
                self.event("response.custom_tool_call_input.done", **where, input=done["input"]),
            ]
        out.append(self.event("response.output_item.done", **where, item=done))
        self.output.append(done)
        self._open, self._buffer = None, ""
        return out

    def end(self, usage_: dict[str, Any], reason: str | None) -> list[bytes]:
        """Close what is open and finish: ``response.completed``, or ``response.incomplete``
        with its reason."""
        if self.ended:
            return []
        out = [*self.start("", self.model), *self.close()]
        self.ended = True
        status = "incomplete" if reason else "completed"
        final = response(self.response_id, self._created, self.model, self.output, status, usage_, reason)
        return [*out, self.event(f"response.{status}", response=final)]
