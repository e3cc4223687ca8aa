"""Anthropic Messages (``POST /v1/messages``), as ingress and as egress."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols import (
    ANTHROPIC_MESSAGES,
    ParsedRequest,
    invalid,
    optional_bool,
    optional_list,
    optional_positive_int,
    parse_json_object,
    require_list,
    require_string,
)
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = ANTHROPIC_MESSAGES
UPSTREAM_PATH = "/v1/messages"  # appended to a base_url without /v1, as Anthropic SDKs expect
DEFAULT_VERSION = "2023-06-01"
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")

_ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.PAYMENT_REQUIRED: "billing_error",
    ErrorKind.PERMISSION: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.REQUEST_TOO_LARGE: "request_too_large",
    ErrorKind.RATE_LIMITED: "rate_limit_error",
    ErrorKind.INTERNAL: "api_error",
    ErrorKind.UPSTREAM: "api_error",
    ErrorKind.UNAVAILABLE: "api_error",
    ErrorKind.TIMEOUT: "timeout_error",
}


def parse(raw: bytes, headers: Mapping[str, str], query: str = "") -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    messages = require_list(body, "messages")
    max_tokens = optional_positive_int(body, "max_tokens")
    if max_tokens is None:
        raise invalid("max_tokens: field required")
    stream = optional_bool(body, "stream")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise invalid("system: expected a string or an array of content blocks")
    tools = optional_list(body, "tools")
    thinking = body.get("thinking")
    if thinking is not None and not isinstance(thinking, dict):
        raise invalid("thinking: expected an object")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if thinking and thinking.get("type") in ("enabled", "adaptive"):
        requires.append("thinking")
    requires.extend(sorted(_content_needs(messages)))
    forward = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, forward, _beta_query(query))


def _content_needs(messages: list[Any]) -> set[str]:
    needs: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]: expected an object")
        content = message.get("content")
        if isinstance(content, list):
            _scan_blocks(content, needs)
    return needs


def _scan_blocks(blocks: list[Any], needs: set[str]) -> None:
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "image":
            needs.add("vision")
        elif kind == "document":
            needs.add("documents")
        elif kind == "tool_result" and isinstance(block.get("content"), list):
            _scan_blocks(block["content"], needs)


def _beta_query(query: str) -> str:
    # Claude Code calls /v1/messages?beta=true; nothing else in a query is forwarded.
    return "beta=true" if "beta=true" in query.split("&") else ""


# --- errors -----------------------------------------------------------------------


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": _ERROR_TYPES[error.kind], "message": error.message}, "request_id": request_id}).encode()


def stream_error(error: GatewayError) -> bytes:
    return encode({"type": "error", "error": {"type": _ERROR_TYPES[error.kind], "message": error.message}}, "error")


# --- egress -----------------------------------------------------------------------


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json", "anthropic-version": forward.get("anthropic-version", DEFAULT_VERSION)}
    if "anthropic-beta" in forward:
        headers["anthropic-beta"] = forward["anthropic-beta"]
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int) -> bytes:
    """The client's own bytes, with only the model swapped when the names differ and, when
    the output must stay within ``ceiling``, a larger max_tokens lowered to it."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if request.cap_output and (request.max_tokens or 0) > ceiling:
        raw = set_member(raw, "max_tokens", ceiling)
    return raw


def is_error_event(event: SSEEvent) -> bool:
    return event.event == "error"


def usage_of(message: Mapping[str, Any]) -> Usage | None:
    """The usage a response reports, or None when it reports none (it is then unknown,
    not zero)."""
    usage = message.get("usage")
    if not isinstance(usage, Mapping) or "input_tokens" not in usage or "output_tokens" not in usage:
        return None
    return Usage(
        input=int(usage.get("input_tokens") or 0),
        output=int(usage.get("output_tokens") or 0),
        cache_read=int(usage.get("cache_read_input_tokens") or 0),
        cache_write=int(usage.get("cache_creation_input_tokens") or 0),
    )


class StreamUsage:
    """Usage read off a Messages stream: ``message_start`` carries the input side,
    each ``message_delta`` the cumulative output; the last value of each field wins.
    ``complete`` says the stream ended properly, ``known`` that it reported final usage."""

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
