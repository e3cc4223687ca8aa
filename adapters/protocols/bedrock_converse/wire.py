"""Bedrock Converse (``POST /model/{modelId}/converse`` and ``/converse-stream``) on
the wire, as ingress and as egress.

The model and whether to stream are in the path, not the body. The client's headers
(its AWS credentials among them) never go upstream: the Bedrock provider signs each
request itself, so this wire sends no key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols import aws_errors
from portcullis.adapters.protocols.bedrock_converse import validator
from portcullis.adapters.protocols.bedrock_converse.surfaces import declared_tools
from portcullis.adapters.protocols.bedrock_paths import model_path, path_model
from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING, FramedEvent
from portcullis.adapters.protocols.jsonbody import invalid, parse_json_object, reasoning_budget, reasoning_effort
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.validation import wrong_type
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = "bedrock_converse"
FRAMING = CONVERSE_FRAMING
TOKEN_COUNT_EXACT = False  # Bedrock's models do not count as tiktoken does: input is bounded, not counted
STREAM_ACTION = "converse-stream"
_THINKING_KEYS = ("thinking", "reasoning_config", "reasoningConfig")  # Anthropic's; Amazon Nova's


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    body = parse_json_object(raw)
    model = path_model(path)
    stream = path.get("action") == STREAM_ACTION
    max_tokens = _max_tokens(body)
    needs = validator.validate(body, limits)
    tools = declared_tools(body)
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if _thinking(body.get("additionalModelRequestFields")):
        requires.append("thinking")
    requires.extend(sorted(needs))
    budget, effort = _reasoning(body.get("additionalModelRequestFields"))
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, tools=tools, reasoning_tokens=budget, reasoning_effort=effort)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    config = body.get("inferenceConfig")
    if config is None:
        return None
    if not isinstance(config, dict):
        raise wrong_type("inferenceConfig", "an object", config)
    value = config.get("maxTokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid("inferenceConfig.maxTokens: expected a positive integer")
    return value


def _thinking(fields: Any) -> bool:
    """Whether the model-specific fields turn reasoning on (any setting but disabled)."""
    if not isinstance(fields, dict):
        return False
    settings = [fields.get(key) for key in _THINKING_KEYS]
    return any(isinstance(s, dict) and s.get("type") != "disabled" for s in settings)


def _reasoning(fields: Any) -> tuple[int | None, str | None]:
    """The reasoning the model-specific fields ask for: Anthropic's budget
    (``thinking.budget_tokens``) or Amazon Nova's named effort (``reasoningConfig``)."""
    if not isinstance(fields, dict):
        return None, None
    budget = reasoning_budget(fields.get("thinking"), "additionalModelRequestFields.thinking.")
    nova = fields.get("reasoningConfig")
    effort = reasoning_effort(nova.get("maxReasoningEffort")) if isinstance(nova, dict) and nova.get("type") == "enabled" else None
    return budget, effort


def client_wants_usage(request: ParsedRequest) -> bool:
    """A Converse stream always ends with its ``metadata`` (usage) event."""
    return True


# --- errors -----------------------------------------------------------------------

error_body = aws_errors.error_body
error_headers = aws_errors.error_headers
error_status = aws_errors.error_status
stream_error = aws_errors.stream_error


# --- egress -----------------------------------------------------------------------


def upstream_path(model: str, stream: bool) -> str:
    return model_path(model, STREAM_ACTION if stream else "converse")


def require_guardrail(body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes:
    """The policy's guardrail as the body's ``guardrailConfig``, replacing whatever the
    client sent (its own could name another guardrail, or stream asynchronously: text
    released before the guardrail judged it)."""
    config = {"guardrailIdentifier": guardrail["identifier"], "guardrailVersion": guardrail["version"]}
    if b'"guardContent"' in body:
        # With guardContent blocks Bedrock judges only those: the policy's guardrail must judge it all.
        document = json.loads(body)
        _unguarded(document)
        body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    return set_member(body, "guardrailConfig", config)


def _unguarded(body: dict[str, Any]) -> None:
    """Every ``guardContent`` block as the plain block it wraps (text or image)."""
    blocks = [*(body.get("system") or ())]
    for message in body.get("messages") or ():
        blocks.extend(message.get("content") or ())
    for block in blocks:
        guarded = block.pop("guardContent", None) if isinstance(block, dict) else None
        if isinstance(guarded, dict) and isinstance(guarded.get("text"), dict):
            block["text"] = guarded["text"].get("text", "")
        elif isinstance(guarded, dict) and "image" in guarded:
            block["image"] = guarded["image"]


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    """No key and no client header: the provider signs the request it sends."""
    return {"content-type": "application/json", "accept": "application/json"}


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes (the model is in the path, not here); when the output must
    stay within ``ceiling`` (None: it need not), ``inferenceConfig.maxTokens`` set to it
    if missing or larger."""
    if ceiling is None or (request.max_tokens is not None and request.max_tokens <= ceiling):
        return request.raw
    config = request.body.get("inferenceConfig") or {}
    return set_member(request.raw, "inferenceConfig", {**config, "maxTokens": ceiling})


def cap_output(body: dict[str, Any], ceiling: int) -> None:
    config = body.get("inferenceConfig")
    if not isinstance(config, dict):
        config = body["inferenceConfig"] = {}
    config["maxTokens"] = min(config.get("maxTokens") or ceiling, ceiling)


def compose(model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of the gateway's own (a classifier's), deterministic; the
    model goes in the path."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": user}]}], "inferenceConfig": {"maxTokens": max_tokens, "temperature": 0}}
    if instructions:  # a system text block may not be empty
        body["system"] = [{"text": instructions}]
    return body


def answer_text(document: Mapping[str, Any]) -> str:
    """The text blocks of an answer, joined; a ValueError when it is not shaped as one."""
    try:
        return "".join(block["text"] for block in document["output"]["message"]["content"] if isinstance(block.get("text"), str))
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the answer is not a Converse response") from None


def is_error_event(event: SSEEvent) -> bool:
    return isinstance(event, FramedEvent) and event.exception


def usage_of(document: Mapping[str, Any]) -> Usage | None:
    """The usage a response (or a stream's ``metadata`` payload) reports, or None when
    it reports none (unknown, not zero). Bedrock's ``inputTokens`` already leaves out
    the cached input, as ``Usage.input`` does."""
    usage = document.get("usage")
    if not isinstance(usage, Mapping) or not isinstance(usage.get("inputTokens"), int) or not isinstance(usage.get("outputTokens"), int):
        return None
    return Usage(
        input=usage["inputTokens"],
        output=usage["outputTokens"],
        cache_read=_count(usage.get("cacheReadInputTokens")),
        cache_write=_count(usage.get("cacheWriteInputTokens")),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def is_usage_only(document: Mapping[str, Any]) -> bool:
    """The ``metadata`` event carries usage and metrics, no content."""
    return "metadata" in document


def intervened(document: Mapping[str, Any]) -> bool:
    """A guardrail stopped the answer (Bedrock says so in the stop reason)."""
    return document.get("stopReason") == GUARDRAIL_STOP


GUARDRAIL_STOP = "guardrail_intervened"


class StreamUsage:
    """Usage read off a Converse stream: the ``metadata`` event reports it, after
    ``messageStop``; the stream is complete when both were seen."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.known = False
        self.intervened = False
        self._stopped = self._reported = False

    @property
    def complete(self) -> bool:
        return self._stopped and self._reported

    def feed(self, event: SSEEvent) -> None:
        if event.event == "messageStop":
            self._stopped = True
            self.intervened = GUARDRAIL_STOP in event.data and _stop_reason(event) == GUARDRAIL_STOP
            return
        if event.event != "metadata":
            return
        self._reported = True
        try:
            payload = json.loads(event.data).get("metadata")
        except (ValueError, AttributeError):
            return
        reported = usage_of(payload) if isinstance(payload, dict) else None
        if reported is not None:
            self.usage, self.known = reported, True


def _stop_reason(event: SSEEvent) -> Any:
    try:
        return json.loads(event.data)["messageStop"].get("stopReason")
    except (ValueError, KeyError, AttributeError, TypeError):
        return None
