"""OpenAI Chat Completions (``POST /v1/chat/completions``) on the wire, as ingress and as egress.
As egress it serves any OpenAI-compatible server (OpenAI, vLLM, ...)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.jsonbody import (
    invalid,
    optional_bool,
    optional_list,
    optional_positive_int,
    parse_json_object,
    reasoning_effort,
    require_list,
    require_string,
)
from portcullis.adapters.protocols.openai_chat import validator
from portcullis.adapters.protocols.openai_chat.surfaces import declared_tools
from portcullis.adapters.protocols.openai_errors import error_object
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest
from portcullis.adapters.protocols.sse import SSE_FRAMING, SSEEvent, encode
from portcullis.engine.errors import GatewayError
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = "openai_chat"
UPSTREAM_PATH = "/chat/completions"  # appended to a base_url that ends in /v1, as OpenAI SDKs expect
FRAMING = SSE_FRAMING
TOKEN_COUNT_EXACT = True  # OpenAI-compatible servers count input as tiktoken does
DONE = b"data: [DONE]\n\n"


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    messages = require_list(body, "messages")
    if not messages:
        raise invalid("messages: must contain at least one message")
    stream = optional_bool(body, "stream")
    current, legacy = optional_positive_int(body, "max_completion_tokens"), optional_positive_int(body, "max_tokens")
    max_tokens = current or legacy
    choices = optional_positive_int(body, "n") or 1
    images = validator.validate(body, limits)
    tools = optional_list(body, "tools")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if images:
        requires.append("vision")
    effort = reasoning_effort(body.get("reasoning_effort"))
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, choices=choices, tools=declared_tools(body), reasoning_effort=effort)


def client_wants_usage(request: ParsedRequest) -> bool:
    options = request.body.get("stream_options") or {}
    return bool(options.get("include_usage"))


# --- errors -----------------------------------------------------------------------


def error_headers(error: GatewayError, request_id: str) -> dict[str, str]:
    return {}


def error_status(error: GatewayError) -> int:
    return error.kind.status


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"error": error_object(error)}).encode()


def stream_error(error: GatewayError) -> bytes:
    return encode({"error": error_object(error)})


# --- egress -----------------------------------------------------------------------


def upstream_path(model: str, stream: bool) -> str:
    return UPSTREAM_PATH


def require_guardrail(body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes:
    return body  # guardrails are Bedrock's: the policy requires them of Bedrock targets only


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes, with the model swapped when the names differ; when the
    output must stay within ``ceiling`` (None: it need not), an output limit set to it
    if missing or larger; and, for a stream, usage requested (the gateway must price
    every stream; the extra usage chunk is withheld from clients that did not ask for it)."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if ceiling is not None and (request.max_tokens is None or request.max_tokens > ceiling):
        # Clamp the field the client used; max_completion_tokens is the current name.
        legacy = "max_tokens" in request.body and "max_completion_tokens" not in request.body
        raw = set_member(raw, "max_tokens" if legacy else "max_completion_tokens", ceiling)
    if request.stream and not client_wants_usage(request):
        options = {**(request.body.get("stream_options") or {}), "include_usage": True}
        raw = set_member(raw, "stream_options", options)
    return raw


def cap_output(body: dict[str, Any], ceiling: int) -> None:
    body["max_completion_tokens"] = min(body.get("max_completion_tokens") or ceiling, ceiling)


def compose(model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of the gateway's own (a classifier's), deterministic."""
    return {
        "model": model,
        "messages": [{"role": "system", "content": instructions}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def answer_text(document: Mapping[str, Any]) -> str:
    """The first choice's content; a ValueError when the answer is not shaped as one."""
    try:
        return document["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the answer is not a Chat completion") from None


def is_error_event(event: SSEEvent) -> bool:
    if '"error"' not in event.data:
        return False
    try:
        return isinstance(event.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False


def usage_of(document: Mapping[str, Any]) -> Usage | None:
    """The usage a response reports, or None when it reports none (unknown, not zero)."""
    usage = document.get("usage")
    if not isinstance(usage, Mapping) or "prompt_tokens" not in usage or "completion_tokens" not in usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Usage(input=prompt - cached, output=int(usage.get("completion_tokens") or 0), cache_read=cached)


def is_usage_only(document: Mapping[str, Any]) -> bool:
    """The last chunk of a stream asked for usage: no choices, only usage."""
    return not document.get("choices") and document.get("usage") is not None


def intervened(document: Mapping[str, Any]) -> bool:
    return False  # its providers have no guard of their own that the gateway reports


class StreamUsage:
    """Usage read off a Chat stream: the chunk that carries ``usage`` (sent last when
    ``stream_options.include_usage`` is set); ``[DONE]`` marks a complete stream. A
    server that ignores ``include_usage`` leaves the usage unknown, not zero."""

    intervened = False

    def __init__(self) -> None:
        self.usage = Usage()
        self.complete = False
        self.known = False

    def feed(self, event: SSEEvent) -> None:
        if event.data == "[DONE]":
            self.complete = True
            return
        if '"usage"' not in event.data:
            return
        try:
            chunk = event.json()
        except ValueError:
            return
        reported = usage_of(chunk) if isinstance(chunk, dict) else None
        if reported is not None:
            self.usage, self.known = reported, True
