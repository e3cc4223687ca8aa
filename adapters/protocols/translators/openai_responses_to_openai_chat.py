"""An OpenAI Responses client (Codex, the ``openai`` SDK's ``client.responses``) served
by an OpenAI-compatible Chat provider (vLLM, OpenAI's Chat Completions, ...).

Converts ``instructions`` and system/developer items (system messages, wherever they
stand: Chat has them anywhere), user text, images (URL or data URL, with ``detail``),
files as data (Chat ``file`` parts), assistant text, function calls and their outputs
(assistant ``tool_calls`` and ``tool`` messages, paired by ``call_id``), function tools
(with ``strict``), ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``,
``temperature``, ``top_p``, ``text.format`` (``response_format``), ``reasoning.effort``
(``reasoning_effort``), ``user`` / ``safety_identifier`` and ``stream`` (with
``stream_options.include_usage``, so the answer can be metered). A provider's
reasoning text (vLLM's ``reasoning_content`` or ``reasoning``) becomes a reasoning item.

Custom (freeform) tools, Codex's ``apply_patch`` among them, go as a function taking
one string ``input`` named ``<name>__freeform`` (``responses_events``), because vLLM and
most Chat servers have no ``custom`` tools; their calls come back as
``custom_tool_call`` with that string as the raw input. A grammar is written into the
description for the model (the provider cannot constrain decoding to it).

Dropped, as changes of cost or style rather than meaning: ``reasoning.summary`` (Chat
returns no summaries), ``text.verbosity``, and the members ``responses_input`` lists.
Refused with a 400 naming the field: built-in, namespace and tool-search tools (they
run at OpenAI), files by URL or ``file_id``, images in tool output (Chat tool messages
are text), reasoning items carrying ``encrypted_content``, ``previous_response_id``
and every other member without an equivalent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.translators import responses_events as events
from portcullis.adapters.protocols.translators import responses_input as read
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "an OpenAI-compatible Chat provider"

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    read.check_members(body, TARGET)
    out: dict[str, Any] = {"model": target.model, "messages": _messages(read.turns(body, TARGET))}
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            out[name] = body[name]
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    user = body.get("safety_identifier") or body.get("user")
    if user:
        out["user"] = str(user)
    fmt = read.text_format(body)
    if fmt is not None:
        out["response_format"] = _response_format(fmt)
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise invalid("reasoning: expected an object")
        if reasoning.get("effort") is not None:
            out["reasoning_effort"] = reasoning["effort"]
    tools = read.tools(body, TARGET)
    if tools:
        out["tools"] = [_tool(tool) for tool in tools]
    choice = read.tool_choice(body, TARGET)
    if isinstance(choice, tuple):
        out["tool_choice"] = {"type": "function", "function": {"name": choice[1]}}
    elif choice is not None:
        out["tool_choice"] = choice
    return out


def _messages(turns: list[read.Turn]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if isinstance(turn, read.Instruction):
            messages.append({"role": "system", "content": turn.text})  # "developer" is OpenAI's alone; servers know "system"
        elif isinstance(turn, read.UserContent):
            messages.append({"role": "user", "content": [_user_part(part, f"{turn.where}[{j}]") for j, part in enumerate(turn.parts)]})
        elif isinstance(turn, read.AssistantText):
            _assistant(messages)["content"] = (_assistant(messages)["content"] or "") + turn.text or None
        elif isinstance(turn, read.Call):
            call = {"id": turn.call_id, "type": "function", "function": {"name": turn.name, "arguments": json.dumps(turn.arguments, ensure_ascii=False)}}
            _assistant(messages).setdefault("tool_calls", []).append(call)
        else:
            content = turn.output if isinstance(turn.output, str) else "".join(read.text_parts(turn.output, f"{turn.where}.output"))
            messages.append({"role": "tool", "tool_call_id": turn.call_id, "content": content})
    return messages


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    # Assistant text and the calls after it are one Chat assistant message.
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _user_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise invalid(f"{where}.image_url: images by file_id cannot be converted for {TARGET}")
        if url.startswith("data:"):
            read.data_url(url, f"{where}.image_url")
        elif not url.startswith(("https://", "http://")):
            raise invalid(f"{where}.image_url: expected an http(s) or data URL")
        image: dict[str, Any] = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        if not isinstance(part.get("file_data"), str):
            raise invalid(f"{where}: only files sent as data can be converted for {TARGET}")
        read.data_url(part["file_data"], f"{where}.file_data")
        file = {"file_data": part["file_data"], **({"filename": part["filename"]} if isinstance(part.get("filename"), str) else {})}
        return {"type": "file", "file": file}
    raise invalid(f"{where}: part type {excerpt(kind)} cannot be converted for {TARGET}")


def _response_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise invalid(f"text.format: {excerpt(fmt.get('type'))} cannot be converted for {TARGET}")
    schema = {name: fmt[name] for name in ("name", "schema", "description", "strict") if fmt.get(name) is not None}
    return {"type": "json_schema", "json_schema": schema}


def _tool(tool: read.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
    if tool.description:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    base = events.base_id(document.get("id"))
    choice = (document.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = reply.get("reasoning_content") or reply.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(events.reasoning_item(f"rs_{base}_0", reasoning))
    if reply.get("content"):
        output.append(events.message_item(f"msg_{base}_{len(output)}", reply["content"]))
    if reply.get("refusal"):
        output.append(events.message_item(f"msg_{base}_{len(output)}", reply["refusal"], refusal=True))
    for call in reply.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(events.call_item(f"fc_{base}_{len(output)}", call.get("id", ""), function.get("name", ""), function.get("arguments") or "{}"))
    reason = _INCOMPLETE.get(choice.get("finish_reason") or "")
    status = "incomplete" if reason else "completed"
    return events.response(f"resp_{base}", created, document.get("model"), output, status, _usage(document.get("usage")), reason)


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None  # unknown, not zero
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return events.usage(int(usage.get("prompt_tokens") or 0), cached, 0, int(usage.get("completion_tokens") or 0), reasoning)


class StreamConverter:
    """Chat completion chunks in, Responses stream events out."""

    def __init__(self, include_usage: bool, created: int) -> None:
        # A Responses stream always ends with its usage; include_usage changes nothing.
        self._stream = events.ResponsesStream(created)
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None
        self._seen_tools: set[int] = set()

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.data == "[DONE]":
            return self._end()
        chunk = event.json()
        if "error" in chunk:
            return []  # the gateway reports it, in the client's shape
        out = self._stream.start(chunk.get("id"), chunk.get("model"))
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                out += self._switch("reasoning", self._stream.open_reasoning) + self._stream.delta(reasoning)
            if delta.get("content"):
                out += self._switch("text", self._stream.open_message) + self._stream.delta(delta["content"])
            if delta.get("refusal"):
                out += self._switch("refusal", lambda key: self._stream.open_message(key, refusal=True)) + self._stream.delta(delta["refusal"])
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                function = call.get("function") or {}
                if self._stream.open_key != ("tool", index):
                    if index in self._seen_tools:
                        raise GatewayError(ErrorKind.UPSTREAM, "the provider interleaved tool calls, which Responses cannot express")
                    self._seen_tools.add(index)
                    out += self._stream.open_call(call.get("id") or "", function.get("name") or "", ("tool", index))
                out += self._stream.delta(function.get("arguments") or "")
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def finish(self) -> list[bytes]:
        return self._end() if self._stream.started else []

    def _switch(self, key: str, opener: Any) -> list[bytes]:
        return [] if self._stream.open_key == key else opener(key)

    def _end(self) -> list[bytes]:
        return self._stream.end(_usage(self._usage), _INCOMPLETE.get(self._finish or ""))


# Guards judge the provider's calls by the names the client declared (custom tools travel as functions).
client_tool_call = events.client_tool_call
