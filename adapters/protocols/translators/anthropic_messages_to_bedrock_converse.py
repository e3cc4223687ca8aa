"""An Anthropic Messages client served by a Bedrock Converse provider.

Converts text, system blocks, base64 images, PDF and plain-text documents, custom
tools, tool use and results (``is_error`` as status ``error``), earlier turns'
thinking (signed reasoning and redacted reasoning, which Bedrock hands back to the
same Anthropic model), prompt-cache markers (as cache points), sampling limits, and
``thinking`` and ``top_k`` as the model's additional request fields. ``metadata`` is
dropped: its user ID tags Anthropic's abuse monitoring and nothing the model reads.
Everything else without a faithful equivalent is refused, naming the field (see
``converse_blocks`` for the block mapping), so the dispatcher tries the next target.

The model and whether to stream are in the Converse path, never the body. Converse
answers carry no message ID or model: the ID is made here, the model left empty."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.adapters.protocols.translators.converse_blocks import (
    CONVERSE,
    SAME_STOP_REASONS,
    DocumentNames,
    each_turn,
    to_converse_content,
    to_converse_system,
)
from portcullis.adapters.protocols.translators.converse_tools import to_converse_tool_choice, to_converse_tools
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "bedrock_converse"

_CONVERTED = {"model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "top_k", "stop_sequences", "tools", "tool_choice", "thinking"}
_DROPPED = {"metadata"}
_THINKING_TYPES = ("enabled", "adaptive")
_STOP_REASONS = {**SAME_STOP_REASONS, "guardrail_intervened": "refusal", "content_filtered": "refusal"}
_MALFORMED = ("malformed_model_output", "malformed_tool_use")


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or name in _DROPPED or value is None:
            continue
        raise invalid(f"{name}: cannot be converted for {CONVERSE}")
    documents = DocumentNames()
    out: dict[str, Any] = {"messages": _turns(body["messages"], documents)}
    system = to_converse_system(body["system"]) if body.get("system") else []
    if system:
        out["system"] = system
    out["inferenceConfig"] = _inference(body)
    additional = _additional_fields(body)
    if additional:
        out["additionalModelRequestFields"] = additional
    tool_config = _tool_config(body, out["messages"])
    if tool_config:
        out["toolConfig"] = tool_config
    return out


def _turns(messages: Any, documents: DocumentNames) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for role, blocks, where in each_turn(messages, CONVERSE):
        content = to_converse_content(blocks, f"{where}.content", documents)
        # Messages merges consecutive turns of one role; Converse wants them alternating.
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(content)
        else:
            turns.append({"role": role, "content": content})
    return turns


def _inference(body: Mapping[str, Any]) -> dict[str, Any]:
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid("max_tokens: expected a positive integer")
    config: dict[str, Any] = {"maxTokens": max_tokens}
    for name, member in (("temperature", "temperature"), ("top_p", "topP")):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise invalid(f"{name}: {CONVERSE} accepts values from 0 to 1")
            config[member] = value
    stop = body.get("stop_sequences")
    if stop:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("stop_sequences: expected an array of strings")
        config["stopSequences"] = list(stop)
    return config


def _additional_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """What Converse has no member for goes to the model as the Anthropic field it is."""
    fields: dict[str, Any] = {}
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind in _THINKING_TYPES:
            fields["thinking"] = dict(thinking)
        elif kind != "disabled":
            raise invalid(f"thinking.type: {excerpt(kind)} cannot be converted for {CONVERSE}")
    top_k = body.get("top_k")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise invalid("top_k: expected a non-negative integer")
        fields["top_k"] = top_k
    return fields


def _tool_config(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    tools = to_converse_tools(body["tools"]) if body.get("tools") else []
    choice = to_converse_tool_choice(body["tool_choice"]) if body.get("tool_choice") is not None else {}
    if choice is None:  # "none": Converse forbids tool calls by offering no tools
        tools = []
    if not tools:
        # Bedrock refuses tool blocks in a conversation that declares no tools.
        if any("toolUse" in block or "toolResult" in block for turn in messages for block in turn["content"]):
            field = "tool_choice" if choice is None else "tools"
            raise invalid(f"{field}: {CONVERSE} needs the tools declared while the conversation holds tool calls or results")
        return None
    config: dict[str, Any] = {"tools": tools}
    if choice:
        config["toolChoice"] = choice
    return config


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    message = (document.get("output") or {}).get("message") or {}
    return {
        "id": _message_id(),
        "type": "message",
        "role": "assistant",
        "model": "",
        "content": [_reply_block(block) for block in message.get("content") or []],
        "stop_reason": _stop_reason(document.get("stopReason")),
        "stop_sequence": None,
        "usage": _messages_usage(document.get("usage") or {}),
    }


def _reply_block(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise _upstream("a content block that is not an object")
    if isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if isinstance(block.get("toolUse"), dict):
        call = block["toolUse"]
        return {"type": "tool_use", "id": call.get("toolUseId"), "name": call.get("name"), "input": call.get("input") or {}}
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("redactedContent"), str):
        return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    if isinstance(reasoning, dict) and isinstance(reasoning.get("reasoningText"), dict):
        text = reasoning["reasoningText"]
        return {"type": "thinking", "thinking": text.get("text") or "", "signature": text.get("signature") or ""}
    if isinstance(block.get("citationsContent"), dict):  # the cited text; its locations have no Messages form here
        parts = block["citationsContent"].get("content") or []
        return {"type": "text", "text": "".join(part.get("text", "") for part in parts if isinstance(part, dict))}
    raise _upstream("a content block Anthropic Messages cannot express")


def _stop_reason(reason: Any) -> str:
    if reason in _MALFORMED:
        raise _upstream("malformed model output")
    return _STOP_REASONS.get(reason, "end_turn")


def _upstream(what: str) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM, f"the provider returned {what}")


def _message_id() -> str:
    return f"msg_bdrk_{uuid.uuid4().hex[:24]}"


def _messages_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    return {
        "input_tokens": int(usage.get("inputTokens") or 0),
        "output_tokens": int(usage.get("outputTokens") or 0),
        "cache_read_input_tokens": int(usage.get("cacheReadInputTokens") or 0),
        "cache_creation_input_tokens": int(usage.get("cacheWriteInputTokens") or 0),
    }


class StreamConverter:
    """Converse stream events in (each document ``{"<eventType>": payload}``), Messages
    stream events out. Converse numbers its blocks as it likes; Messages counts from 0."""

    def __init__(self, wants_usage: bool, created: int) -> None:
        self._started = False
        self._ended = False
        self._indices: dict[int, int] = {}  # Converse contentBlockIndex -> Messages index
        self._open: set[int] = set()  # Messages indices started and not stopped
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] = {}

    def feed(self, event: SSEEvent) -> list[bytes]:
        document = event.json()
        if self._ended or not isinstance(document, dict) or len(document) != 1:
            return []
        ((kind, payload),) = document.items()
        if not isinstance(payload, dict):
            return []
        out = self._start()
        if kind == "contentBlockStart":
            out += self._block_start(payload)
        elif kind == "contentBlockDelta":
            out += self._block_delta(payload)
        elif kind == "contentBlockStop":
            index = self._indices.get(payload.get("contentBlockIndex", 0))
            if index in self._open:
                self._open.discard(index)
                out.append(encode({"type": "content_block_stop", "index": index}, "content_block_stop"))
        elif kind == "messageStop":
            self._stop_reason = _stop_reason(payload.get("stopReason"))
        elif kind == "metadata":
            self._usage = payload.get("usage") or {}
            out += self._end()
        return out

    def finish(self) -> list[bytes]:
        # A stream that said why it stopped but sent no usage still ends as Messages ends.
        return self._end() if self._stop_reason is not None and not self._ended else []

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        message = {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [encode({"type": "message_start", "message": message}, "message_start")]

    def _open_block(self, converse_index: int, block: dict[str, Any]) -> tuple[int, list[bytes]]:
        if converse_index in self._indices:
            return self._indices[converse_index], []
        index = len(self._indices)
        self._indices[converse_index] = index
        self._open.add(index)
        return index, [encode({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")]

    def _block_start(self, payload: Mapping[str, Any]) -> list[bytes]:
        call = (payload.get("start") or {}).get("toolUse")
        if not isinstance(call, dict):
            raise _upstream("a content block start Anthropic Messages cannot express")
        block = {"type": "tool_use", "id": call.get("toolUseId"), "name": call.get("name"), "input": {}}
        return self._open_block(payload.get("contentBlockIndex", 0), block)[1]

    def _block_delta(self, payload: Mapping[str, Any]) -> list[bytes]:
        at, delta = payload.get("contentBlockIndex", 0), payload.get("delta") or {}
        if isinstance(delta.get("text"), str):
            index, out = self._open_block(at, {"type": "text", "text": ""})
            return [*out, self._delta(index, {"type": "text_delta", "text": delta["text"]})]
        if isinstance(delta.get("toolUse"), dict):
            if at not in self._indices:
                raise _upstream("tool input for a tool call it never started")
            return [self._delta(self._indices[at], {"type": "input_json_delta", "partial_json": delta["toolUse"].get("input") or ""})]
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            if isinstance(reasoning.get("redactedContent"), str):  # Messages starts a redacted block whole
                return self._open_block(at, {"type": "redacted_thinking", "data": reasoning["redactedContent"]})[1]
            index, out = self._open_block(at, {"type": "thinking", "thinking": "", "signature": ""})
            if isinstance(reasoning.get("text"), str):
                out.append(self._delta(index, {"type": "thinking_delta", "thinking": reasoning["text"]}))
            if isinstance(reasoning.get("signature"), str):
                out.append(self._delta(index, {"type": "signature_delta", "signature": reasoning["signature"]}))
            return out
        return []  # citation deltas: their locations have no Messages form here

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> bytes:
        return encode({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")

    def _end(self) -> list[bytes]:
        self._ended = True
        out = [encode({"type": "content_block_stop", "index": index}, "content_block_stop") for index in sorted(self._open)]
        self._open.clear()
        delta = {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": None}
        out.append(encode({"type": "message_delta", "delta": delta, "usage": _messages_usage(self._usage)}, "message_delta"))
        out.append(encode({"type": "message_stop"}, "message_stop"))
        return out
