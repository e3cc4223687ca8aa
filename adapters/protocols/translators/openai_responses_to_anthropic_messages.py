"""An OpenAI Responses client (Codex, the ``openai`` SDK's ``client.responses``) served
by an Anthropic Messages provider.

Converts ``instructions`` and system/developer items (the system prompt: only before
the conversation starts, as in Messages), user text, images (URL or data URL) and files
(``input_file`` as a ``document``: PDF or plain text, as data or URL), assistant text,
function calls and their outputs (``tool_use`` / ``tool_result``, paired by
``call_id``), function tools, ``tool_choice``, ``parallel_tool_calls``,
``max_output_tokens`` (the target's ceiling when unset: Messages requires one),
``temperature``, ``top_p``, ``user`` / ``safety_identifier`` and ``stream``.

Custom (freeform) tools, Codex's ``apply_patch`` among them, go as a tool taking one
string ``input`` named ``<name>__freeform`` (``responses_events``); its calls come back
as ``custom_tool_call`` with that string as the raw input. A grammar cannot constrain
Anthropic's decoding, so it is written into the tool's description for the model.

Dropped, as changes of cost or style rather than meaning: ``reasoning`` (Anthropic
thinks only when asked, with a budget and signed blocks a Responses client cannot
replay, so no thinking is requested), ``text.verbosity``, image ``detail``, and the
members ``responses_input`` lists. Refused with a 400 naming the field: built-in,
namespace and tool-search tools (they run at OpenAI), ``text.format`` other than text
(Messages has no JSON-schema output), reasoning items carrying ``encrypted_content``,
files by ``file_id``, ``previous_response_id`` and every other member without an
equivalent."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.translators import responses_events as events
from portcullis.adapters.protocols.translators import responses_input as read
from portcullis.engine.errors import excerpt
from portcullis.engine.plan import Target

TARGET = "Anthropic Messages"

# Stop reasons that leave the response incomplete, with the Responses reason.
_INCOMPLETE = {"max_tokens": "max_output_tokens", "model_context_window_exceeded": "max_output_tokens", "refusal": "content_filter"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    read.check_members(body, TARGET)
    if read.text_format(body) is not None:
        raise invalid(f"text.format: structured output cannot be converted for {TARGET}")
    if body.get("reasoning") is not None and not isinstance(body["reasoning"], dict):
        raise invalid("reasoning: expected an object")
    system, messages = _conversation(read.turns(body, TARGET))
    out: dict[str, Any] = {"model": target.model, "max_tokens": body.get("max_output_tokens") or target.max_output_tokens, "messages": messages}
    if system:
        out["system"] = system
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise invalid(f"{name}: {TARGET} accepts values from 0 to 1")
            out[name] = value
    if stream:
        out["stream"] = True
    user = body.get("safety_identifier") or body.get("user")
    if user:
        out["metadata"] = {"user_id": str(user)}
    tools = read.tools(body, TARGET)
    if tools:
        out["tools"] = [{"name": t.name, "input_schema": t.parameters, **({"description": t.description} if t.description else {})} for t in tools]
    choice = _tool_choice(read.tool_choice(body, TARGET), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _conversation(turns: list[read.Turn]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if isinstance(turn, read.Instruction):
            if messages:
                raise invalid(f"{turn.where}: a system or developer message after the conversation started cannot be converted to {TARGET}")
            system.append({"type": "text", "text": turn.text})
        elif isinstance(turn, read.UserContent):
            _append(messages, "user", [_user_part(part, f"{turn.where}[{j}]") for j, part in enumerate(turn.parts)])
        elif isinstance(turn, read.AssistantText):
            if turn.text:
                _append(messages, "assistant", [{"type": "text", "text": turn.text}])
        elif isinstance(turn, read.Call):
            _append(messages, "assistant", [{"type": "tool_use", "id": turn.call_id, "name": turn.name, "input": turn.arguments}])
        else:
            _append(messages, "user", [{"type": "tool_result", "tool_use_id": turn.call_id, "content": _result(turn)}])
    return system, messages


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # Consecutive items of one role make one Messages turn: the tool results answering
    # one assistant turn must travel together in the next user turn.
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _user_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image":
        return _image(part, where)
    if kind == "input_file":
        return _document(part, where)
    raise invalid(f"{where}: part type {excerpt(kind)} cannot be converted to {TARGET}")


def _image(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str):
        raise invalid(f"{where}.image_url: images by file_id cannot be converted to {TARGET}")
    if url.startswith("data:"):
        media_type, data = read.data_url(url, f"{where}.image_url")
        if not media_type.startswith("image/"):
            raise invalid(f"{where}.image_url: expected an image data URL")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise invalid(f"{where}.image_url: expected an http(s) or data URL")


def _document(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    title = {"title": part["filename"]} if isinstance(part.get("filename"), str) else {}
    if isinstance(part.get("file_url"), str):
        return {"type": "document", "source": {"type": "url", "url": part["file_url"]}, **title}
    if not isinstance(part.get("file_data"), str):
        raise invalid(f"{where}: files by file_id cannot be converted to {TARGET}")
    media_type, data = read.data_url(part["file_data"], f"{where}.file_data")
    if media_type == "application/pdf":
        return {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": data}, **title}
    if media_type == "text/plain":
        try:
            text = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise invalid(f"{where}.file_data: not base64 UTF-8 text") from None
        return {"type": "document", "source": {"type": "text", "media_type": media_type, "data": text}, **title}
    raise invalid(f"{where}.file_data: only PDF and plain-text files can be converted to {TARGET}")


def _result(turn: read.Result) -> str | list[dict[str, Any]]:
    if isinstance(turn.output, str):
        return turn.output
    blocks = []
    for j, part in enumerate(turn.output):
        block = _user_part(part, f"{turn.where}.output[{j}]")
        if block["type"] == "document":  # tool results hold text and images only
            raise invalid(f"{turn.where}.output[{j}]: files in tool output cannot be converted to {TARGET}")
        blocks.append(block)
    return blocks


def _tool_choice(choice: str | tuple[str, str] | None, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        converted = {"type": "auto"} if parallel is False else None
    elif isinstance(choice, tuple):
        converted = {"type": "tool", "name": choice[1]}
    else:
        converted = {"type": {"required": "any"}.get(choice, choice)}
    if converted is not None and parallel is False and converted["type"] != "none":
        converted["disable_parallel_tool_use"] = True
    return converted


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    base = events.base_id(document.get("id"))
    output: list[dict[str, Any]] = []
    for block in document.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            output.append(events.message_item(f"msg_{base}_{len(output)}", block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            output.append(events.call_item(f"fc_{base}_{len(output)}", block.get("id", ""), block.get("name", ""), arguments))
        # thinking is never requested; other blocks belong to Anthropic's server tools, never offered
    reason = _INCOMPLETE.get(document.get("stop_reason") or "")
    status = "incomplete" if reason else "completed"
    return events.response(f"resp_{base}", created, document.get("model"), output, status, _usage(document.get("usage") or {}), reason)


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    cached = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    total_input = int(usage.get("input_tokens") or 0) + cached + written
    return events.usage(total_input, cached, written, int(usage.get("output_tokens") or 0), 0)


class StreamConverter:
    """Messages stream events in, Responses stream events out."""

    def __init__(self, include_usage: bool, created: int) -> None:
        # A Responses stream always ends with its usage; include_usage changes nothing.
        self._stream = events.ResponsesStream(created)
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.event in (None, "ping", "error"):
            return []  # an error is the gateway's to report, in the client's shape
        data = event.json()
        if event.event == "message_start":
            message = data.get("message") or {}
            self._usage.update(message.get("usage") or {})
            return self._stream.start(message.get("id"), message.get("model"))
        out = self._stream.start("", "")
        if event.event == "content_block_start":
            block, index = data.get("content_block") or {}, data.get("index")
            if block.get("type") == "text":
                out += self._stream.open_message(index) + self._stream.delta(block.get("text") or "")
            elif block.get("type") == "tool_use":
                out += self._stream.open_call(block.get("id", ""), block.get("name", ""), index)
        elif event.event == "content_block_delta":
            delta = data.get("delta") or {}
            if data.get("index") == self._stream.open_key:
                out += self._stream.delta(delta.get("text") or delta.get("partial_json") or "")
        elif event.event == "content_block_stop":
            if self._stream.open_kind is not None and data.get("index") == self._stream.open_key:
                out += self._stream.close()
        elif event.event == "message_delta":
            self._stop_reason = (data.get("delta") or {}).get("stop_reason") or self._stop_reason
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
        elif event.event == "message_stop":
            out += self._end()
        return out

    def finish(self) -> list[bytes]:
        return self._end() if self._stream.started else []

    def _end(self) -> list[bytes]:
        return self._stream.end(_usage(self._usage), _INCOMPLETE.get(self._stop_reason or ""))


# Guards judge the provider's calls by the names the client declared (custom tools travel as functions).
client_tool_call = events.client_tool_call
