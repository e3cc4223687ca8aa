"""Anthropic Messages (``POST /v1/messages``) on the wire, as ingress and as egress."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.anthropic_messages import validator
from portcullis.adapters.protocols.anthropic_messages.surfaces import declared_tools
from portcullis.adapters.protocols.jsonbody import (
    forwarded_headers,
    invalid,
    optional_bool,
    optional_list,
    optional_positive_int,
    parse_json_object,
    reasoning_budget,
    require_string,
)
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest
from portcullis.adapters.protocols.sse import SSE_FRAMING, SSEEvent, encode
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = "anthropic_messages"
UPSTREAM_PATH = "/v1/messages"  # appended to a base_url without /v1, as Anthropic SDKs expect
FRAMING = SSE_FRAMING
TOKEN_COUNT_EXACT = False  # Claude's tokenizer is not tiktoken: input is bounded, not counted
DEFAULT_VERSION = "2023-06-01"
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")

_ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.PAYMENT_REQUIRED: "billing_error",
    ErrorKind.PERMISSION: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorKind.UPGRADE_REQUIRED: "invalid_request_error",
    ErrorKind.REQUEST_TIMEOUT: "timeout_error",
    ErrorKind.REQUEST_TOO_LARGE: "request_too_large",
    ErrorKind.HEADERS_TOO_LARGE: "request_too_large",
    ErrorKind.RATE_LIMITED: "rate_limit_error",
    ErrorKind.INTERNAL: "api_error",
    ErrorKind.UPSTREAM: "api_error",
    ErrorKind.UNAVAILABLE: "api_error",
    ErrorKind.TIMEOUT: "timeout_error",
}


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    return parse_messages(raw, headers, query, limits, counting=False)


def parse_messages(raw: bytes, headers: Mapping[str, str], query: str, limits: RequestLimits, counting: bool) -> ParsedRequest:
    """A Messages body, validated; ``counting``: a count_tokens body, which names no
    output limit and is never streamed (its other fields are checked the same way)."""
    body = parse_json_object(raw)
    model = require_string(body, "model")
    request = messages_request(NAME, raw, body, model, limits, counting=counting)
    request.forward_headers = forwarded_headers(headers, FORWARDED_HEADERS, limits)
    request.query = _beta_query(query)
    return request


def messages_request(
    protocol: str, raw: bytes, body: dict[str, Any], model: str, limits: RequestLimits, counting: bool = False, stream: bool | None = None
) -> ParsedRequest:
    """Every field of a Messages body but ``model`` validated, as the protocols whose
    bodies are Messages bodies share it (Bedrock InvokeModel's names the model and the
    stream in its path: ``stream`` is then given, not read). No headers forwarded."""
    max_tokens = optional_positive_int(body, "max_tokens")
    stream = (optional_bool(body, "stream") if stream is None else stream) and not counting
    needs = validator.validate(body, limits)
    if max_tokens is None and not counting:
        raise invalid("max_tokens: field required")
    tools = optional_list(body, "tools")
    thinking = body.get("thinking")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if thinking and thinking.get("type") in ("enabled", "adaptive"):
        requires.append("thinking")
    requires.extend(sorted(needs))
    budget = reasoning_budget(thinking, "thinking.")
    return ParsedRequest(protocol, raw, body, model, stream, max_tokens, requires, tools=declared_tools(body), reasoning_tokens=budget)


def client_wants_usage(request: ParsedRequest) -> bool:
    """A Messages stream always reports usage."""
    return True


def _beta_query(query: str) -> str:
    # Claude Code calls /v1/messages?beta=true; nothing else in a query is forwarded.
    return "beta=true" if "beta=true" in query.split("&") else ""


# --- errors -----------------------------------------------------------------------


def error_headers(error: GatewayError, request_id: str) -> dict[str, str]:
    return {}


def error_status(error: GatewayError) -> int:
    return error.kind.status


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"type": "error", "error": _error_object(error), "request_id": request_id}).encode()


def stream_error(error: GatewayError) -> bytes:
    return encode({"type": "error", "error": _error_object(error)}, "error")


def _error_object(error: GatewayError) -> dict[str, Any]:
    # ``code`` is Portcullis's own: the SDKs keep extra members of ``error`` (body, .error).
    return {"type": _ERROR_TYPES[error.kind], "message": error.message, "code": error.error_code}


# --- egress -----------------------------------------------------------------------


def upstream_path(model: str, stream: bool) -> str:
    return UPSTREAM_PATH


def require_guardrail(body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes:
    return body  # guardrails are Bedrock's: the policy requires them of Bedrock targets only


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json", "anthropic-version": forward.get("anthropic-version", DEFAULT_VERSION)}
    if "anthropic-beta" in forward:
        headers["anthropic-beta"] = forward["anthropic-beta"]
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes, with only the model swapped when the names differ and, when
    the output must stay within ``ceiling`` (None: it need not), a larger max_tokens
    lowered to it."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if ceiling is not None and (request.max_tokens or 0) > ceiling:
        raw = set_member(raw, "max_tokens", ceiling)
    return raw


def cap_output(body: dict[str, Any], ceiling: int) -> None:
    body["max_tokens"] = min(body.get("max_tokens") or ceiling, ceiling)


def compose(model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of the gateway's own (a classifier's), deterministic."""
    return {"model": model, "system": instructions, "messages": [{"role": "user", "content": user}], "max_tokens": max_tokens, "temperature": 0}


def answer_text(document: Mapping[str, Any]) -> str:
    """The text blocks of an answer, joined; a ValueError when it is not shaped as one."""
    try:
        return "".join(block.get("text", "") for block in document["content"] if block.get("type") == "text")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the answer is not a Messages response") from None


def is_error_event(event: SSEEvent) -> bool:
    return event.event == "error"


def usage_of(document: Mapping[str, Any]) -> Usage | None:
    """The usage a response reports, or None when it reports none (it is then unknown,
    not zero)."""
    usage = document.get("usage")
    if not isinstance(usage, Mapping) or "input_tokens" not in usage or "output_tokens" not in usage:
        return None
    return Usage(
        input=int(usage.get("input_tokens") or 0),
        output=int(usage.get("output_tokens") or 0),
        cache_read=int(usage.get("cache_read_input_tokens") or 0),
        cache_write=int(usage.get("cache_creation_input_tokens") or 0),
    )


def is_usage_only(document: Mapping[str, Any]) -> bool:
    """Messages has no event that carries only usage."""
    return False


def intervened(document: Mapping[str, Any]) -> bool:
    return False  # its providers have no guard of their own that the gateway reports


class StreamUsage:
    """Usage read off a Messages stream: ``message_start`` carries the input side,
    each ``message_delta`` the cumulative output; the last value of each field wins.
    ``complete`` says the stream ended properly, ``known`` that it reported final usage."""

    intervened = False

    def __init__(self) -> None:
        self._fields: dict[str, int] = {}
        self.complete = False
        self.known = False

    def feed(self, event: SSEEvent) -> None:
        if event.event not in ("message_start", "message_delta", "message_stop"):
            return
        if event.event == "message_stop":
            self.complete = True
            return
        try:
            data = event.json()
        except ValueError:
            return
        usage = (data.get("message") or {}).get("usage") if event.event == "message_start" else data.get("usage")
        for key, value in (usage or {}).items():
            if isinstance(value, int):
                self._fields[key] = value
        if event.event == "message_delta" and isinstance((usage or {}).get("output_tokens"), int):
            self.known = "input_tokens" in self._fields

    @property
    def usage(self) -> Usage:
        return usage_of({"usage": {"input_tokens": 0, "output_tokens": 0, **self._fields}}) or Usage()
