"""A Bedrock Converse client (boto3's ``converse`` and ``converse_stream``) served by an
Anthropic Messages provider.

Converts text, system blocks, image bytes, PDF and plain-text documents, custom tools,
tool use and results (a ``json`` result as its JSON text, status ``error`` as
``is_error``), earlier turns' reasoning, cache points (as ``cache_control`` on the
block before), the inference configuration, and the Anthropic fields Converse passes
through ``additionalModelRequestFields`` (``thinking``, ``top_k``). ``requestMetadata``
is dropped: it tags Bedrock's invocation logs, nothing the model reads; the default
latency and service tier ask for nothing. Guardrails, prompt variables and
everything else Anthropic Messages cannot express are refused, naming the field.

The model and whether to stream come from the Converse path. Converse answers report
the latency; a converted stream reports the time from its first event to its last,
a converted answer 0 (the gateway did not time the provider's work alone)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.eventstream import event_frame
from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.translators.converse_blocks import MESSAGES, SAME_STOP_REASONS, each_turn, to_messages_content, to_messages_system
from portcullis.adapters.protocols.translators.converse_tools import to_messages_tools
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt
from portcullis.engine.plan import Target

TARGET = "anthropic_messages"

_CONVERTED = {"modelId", "messages", "system", "inferenceConfig", "toolConfig", "additionalModelRequestFields"}
_DROPPED = {"requestMetadata"}
# Members accepted only at the value that asks for nothing.
_NO_OP: dict[str, Any] = {"performanceConfig": {"latency": "standard"}, "serviceTier": {"type": "default"}}
_INFERENCE = {"maxTokens": "max_tokens", "temperature": "temperature", "topP": "top_p", "stopSequences": "stop_sequences"}
_ADDITIONAL = ("thinking", "top_k")
_STOP_REASONS = {**SAME_STOP_REASONS, "refusal": "content_filtered", "pause_turn": "end_turn"}


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    for name, value in body.items():
        if name in _CONVERTED or name in _DROPPED or value is None:
            continue
        if name in _NO_OP and value == _NO_OP[name]:
            continue
        raise invalid(f"{name}: cannot be converted for {MESSAGES}")
    out: dict[str, Any] = {"model": target.model, "messages": _turns(body.get("messages"))}
    inference = _inference(body.get("inferenceConfig") or {})
    out["max_tokens"] = inference.pop("max_tokens", None) or target.max_output_tokens
    system = to_messages_system(body["system"]) if body.get("system") else []
    if system:
        out["system"] = system
    out.update(inference)
    out.update(_additional_fields(body.get("additionalModelRequestFields") or {}))
    if body.get("toolConfig") is not None:
        tools, choice = to_messages_tools(body["toolConfig"])
        if tools:
            out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
    if stream:
        out["stream"] = True
    return out


def _turns(messages: Any) -> list[dict[str, Any]]:
    return [{"role": role, "content": to_messages_content(content, f"{where}.content")} for role, content, where in each_turn(messages, MESSAGES)]


def _inference(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise invalid("inferenceConfig: expected an object")
    out: dict[str, Any] = {}
    for name, value in config.items():
        if name not in _INFERENCE:
            raise invalid(f"inferenceConfig.{name}: cannot be converted for {MESSAGES}")
        if value is None:
            continue
        if name == "maxTokens" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise invalid("inferenceConfig.maxTokens: expected a positive integer")
        if name in ("temperature", "topP") and (not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1):
            raise invalid(f"inferenceConfig.{name}: {MESSAGES} accepts values from 0 to 1")
        if name == "stopSequences" and (not isinstance(value, list) or not all(isinstance(s, str) for s in value)):
            raise invalid("inferenceConfig.stopSequences: expected an array of strings")
        if name != "stopSequences" or value:
            out[_INFERENCE[name]] = value
    return out


def _additional_fields(fields: Any) -> dict[str, Any]:
    if not isinstance(fields, dict):
        raise invalid("additionalModelRequestFields: expected an object")
    for name in fields:
        if name not in _ADDITIONAL:
            raise invalid(f"additionalModelRequestFields.{name}: cannot be converted for {MESSAGES}")
    out: dict[str, Any] = {}
    thinking = fields.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive", "disabled"):
            raise invalid("additionalModelRequestFields.thinking.type: expected enabled, adaptive or disabled")
        out["thinking"] = dict(thinking)
    top_k = fields.get("top_k")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise invalid("additionalModelRequestFields.top_k: expected a non-negative integer")
        out["top_k"] = top_k
    return out


# --- responses ---------------------------------------------------------------------


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    content = [_reply_block(block) for block in document.get("content") or []]
    return {
        "output": {"message": {"role": "assistant", "content": [block for block in content if block is not None]}},
        "stopReason": _STOP_REASONS.get(document.get("stop_reason"), "end_turn"),
        "usage": _converse_usage(document.get("usage") or {}),
        "metrics": {"latencyMs": 0},
    }


def _reply_block(block: Any) -> dict[str, Any] | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return {"text": block.get("text") or ""}  # citations: their locations have no Converse form here
    if kind == "tool_use":
        return {"toolUse": {"toolUseId": block.get("id"), "name": block.get("name"), "input": block.get("input") or {}}}
    if kind == "thinking":
        return {"reasoningContent": {"reasoningText": {"text": block.get("thinking") or "", "signature": block.get("signature") or ""}}}
    if kind == "redacted_thinking":
        return {"reasoningContent": {"redactedContent": block.get("data") or ""}}
    raise GatewayError(ErrorKind.UPSTREAM, f"the provider returned a content block ({excerpt(kind)}) Bedrock Converse cannot express")


def _converse_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    read = int(usage.get("cache_read_input_tokens") or 0)
    write = int(usage.get("cache_creation_input_tokens") or 0)
    prompt, completion = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return {
        "inputTokens": prompt,
        "outputTokens": completion,
        "totalTokens": prompt + completion + read + write,
        "cacheReadInputTokens": read,
        "cacheWriteInputTokens": write,
    }


class StreamConverter:
    """Messages stream events in, Converse event-stream frames out, ending as Bedrock
    does: ``messageStop``, then ``metadata`` with the usage and the latency."""

    def __init__(self, wants_usage: bool, created: int) -> None:
        self._began = time.monotonic()
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.event in (None, "ping"):
            return []
        data = event.json()
        if event.event == "message_start":
            self._usage.update((data.get("message") or {}).get("usage") or {})
            return [event_frame("messageStart", {"role": "assistant"})]
        if event.event == "content_block_start":
            return self._block_start(data.get("index", 0), data.get("content_block") or {})
        if event.event == "content_block_delta":
            return self._block_delta(data.get("index", 0), data.get("delta") or {})
        if event.event == "content_block_stop":
            return [event_frame("contentBlockStop", {"contentBlockIndex": data.get("index", 0)})]
        if event.event == "message_delta":
            self._stop_reason = (data.get("delta") or {}).get("stop_reason") or self._stop_reason
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            return []
        if event.event == "message_stop":
            latency = int((time.monotonic() - self._began) * 1000)
            return [
                event_frame("messageStop", {"stopReason": _STOP_REASONS.get(self._stop_reason or "end_turn", "end_turn")}),
                event_frame("metadata", {"usage": _converse_usage(self._usage), "metrics": {"latencyMs": latency}}),
            ]
        return []

    def finish(self) -> list[bytes]:
        return []

    def _block_start(self, index: int, block: Mapping[str, Any]) -> list[bytes]:
        kind = block.get("type")
        if kind == "tool_use":
            start = {"toolUse": {"toolUseId": block.get("id"), "name": block.get("name")}}
            return [event_frame("contentBlockStart", {"start": start, "contentBlockIndex": index})]
        # Converse starts only tool blocks; text and reasoning begin with their first delta.
        if kind == "text":
            return [self._delta(index, {"text": block["text"]})] if block.get("text") else []
        if kind == "thinking":
            return [self._delta(index, {"reasoningContent": {"text": block["thinking"]}})] if block.get("thinking") else []
        if kind == "redacted_thinking":
            return [self._delta(index, {"reasoningContent": {"redactedContent": block.get("data") or ""}})]
        raise GatewayError(ErrorKind.UPSTREAM, f"the provider streamed a content block ({excerpt(kind)}) Bedrock Converse cannot express")

    def _block_delta(self, index: int, delta: Mapping[str, Any]) -> list[bytes]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [self._delta(index, {"text": delta.get("text") or ""})]
        if kind == "input_json_delta":
            return [self._delta(index, {"toolUse": {"input": delta.get("partial_json") or ""}})]
        if kind == "thinking_delta":
            return [self._delta(index, {"reasoningContent": {"text": delta.get("thinking") or ""}})]
        if kind == "signature_delta":
            return [self._delta(index, {"reasoningContent": {"signature": delta.get("signature") or ""}})]
        return []  # citation deltas: their locations have no Converse form here

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> bytes:
        return event_frame("contentBlockDelta", {"delta": delta, "contentBlockIndex": index})
