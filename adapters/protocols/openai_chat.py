"""OpenAI Chat Completions (``POST /v1/chat/completions``), as ingress and as egress.
As egress it serves any OpenAI-compatible server (OpenAI, vLLM, ...)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols import (
    OPENAI_CHAT,
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
from portcullis.adapters.protocols.text import (
    Handler,
    StreamText,
    TextVisitor,
    content_kind,
    each,
    members,
    visit_json_text,
    visit_leaves,
    visit_members,
    visit_schema,
)
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = OPENAI_CHAT
UPSTREAM_PATH = "/chat/completions"  # appended to a base_url that ends in /v1, as OpenAI SDKs expect
DONE = b"data: [DONE]\n\n"

_ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: ("invalid_request_error", None),
    ErrorKind.AUTHENTICATION: ("authentication_error", "invalid_api_key"),
    ErrorKind.PAYMENT_REQUIRED: ("insufficient_quota", None),
    ErrorKind.PERMISSION: ("permission_error", None),
    ErrorKind.NOT_FOUND: ("invalid_request_error", "model_not_found"),
    ErrorKind.REQUEST_TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.RATE_LIMITED: ("rate_limit_error", "rate_limit_exceeded"),
    ErrorKind.INTERNAL: ("server_error", None),
    ErrorKind.UPSTREAM: ("server_error", None),
    ErrorKind.UNAVAILABLE: ("server_error", None),
    ErrorKind.TIMEOUT: ("server_error", "timeout"),
}


def parse(raw: bytes, headers: Mapping[str, str], query: str = "") -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    messages = require_list(body, "messages")
    if not messages:
        raise invalid("messages: must contain at least one message")
    stream = optional_bool(body, "stream")
    max_tokens = optional_positive_int(body, "max_completion_tokens") or optional_positive_int(body, "max_tokens")
    choices = optional_positive_int(body, "n") or 1
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid("stream_options: expected an object")
    tools = optional_list(body, "tools")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if _has_images(messages):
        requires.append("vision")
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, choices=choices)


def _has_images(messages: list[Any]) -> bool:
    found = False
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]: expected an object")
        content = message.get("content")
        if isinstance(content, list):
            found = found or any(isinstance(part, dict) and part.get("type") == "image_url" for part in content)
    return found


def client_wants_usage(request: ParsedRequest) -> bool:
    options = request.body.get("stream_options") or {}
    return bool(options.get("include_usage"))


# --- errors -----------------------------------------------------------------------


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"error": _error_object(error)}).encode()


def stream_error(error: GatewayError) -> bytes:
    return encode({"error": _error_object(error)})


def _error_object(error: GatewayError) -> dict[str, Any]:
    kind, native_code = _ERROR_TYPES[error.kind]  # OpenAI's own code where it has one, so SDK users' checks work
    return {"message": error.message, "type": kind, "param": None, "code": native_code or error.code}


# --- egress -----------------------------------------------------------------------


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int) -> bytes:
    """The client's own bytes, with the model swapped when the names differ; when the
    output must stay within ``ceiling``, an output limit set to it if missing or larger;
    and, for a stream, usage requested (the gateway must price every stream; the extra
    usage chunk is withheld from clients that did not ask for it)."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if request.cap_output and (request.max_tokens is None or request.max_tokens > ceiling):
        # Clamp the field the client used; max_completion_tokens is the current name.
        legacy = "max_tokens" in request.body and "max_completion_tokens" not in request.body
        raw = set_member(raw, "max_tokens" if legacy else "max_completion_tokens", ceiling)
    if request.stream and not client_wants_usage(request):
        options = {**(request.body.get("stream_options") or {}), "include_usage": True}
        raw = set_member(raw, "stream_options", options)
    return raw


def is_error_event(event: SSEEvent) -> bool:
    if '"error"' not in event.data:
        return False
    try:
        return isinstance(event.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False


def usage_of(completion: Mapping[str, Any]) -> Usage | None:
    """The usage a response reports, or None when it reports none (unknown, not zero)."""
    usage = completion.get("usage")
    if not isinstance(usage, Mapping) or "prompt_tokens" not in usage or "completion_tokens" not in usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Usage(input=prompt - cached, output=int(usage.get("completion_tokens") or 0), cache_read=cached)


def is_usage_only_chunk(chunk: Mapping[str, Any]) -> bool:
    return not chunk.get("choices") and chunk.get("usage") is not None


class StreamUsage:
    """Usage read off a Chat stream: the chunk that carries ``usage`` (sent last when
    ``stream_options.include_usage`` is set); ``[DONE]`` marks a complete stream. A
    server that ignores ``include_usage`` leaves the usage unknown, not zero."""

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


# --- prompt and answer text -----------------------------------------------------------

_UNINSPECTABLE_PARTS = {"image_url": "image", "input_audio": "audio", "file": "file"}


def visit_prompt(body: dict[str, Any], visit: TextVisitor) -> list[str]:
    """Visits every string of the request the model will read, in the order it reads
    them (tools first), so placeholders number in prompt order and a new turn never
    renumbers an earlier one. Returns the kinds of content that cannot be inspected
    (images, audio, files, unknown parts)."""
    opaque: list[str] = []

    def text(surface: str) -> Handler:
        return lambda value: visit(surface, value) if isinstance(value, str) else visit_leaves(value, surface, visit)

    def content(surface: str) -> Handler:
        def handle(value: Any) -> Any:
            if not isinstance(value, list):
                return text(surface)(value)
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in ("text", "refusal"):
                    visit_members(part, {kind: text(surface)}, visit)
                else:
                    opaque.append(_UNINSPECTABLE_PARTS.get(kind) or content_kind(kind))
            return value

        return handle

    function = members({"description": text("tool_descriptions"), "parameters": lambda v: visit_schema(v, visit)}, visit)
    arguments = members({"arguments": lambda v: visit_json_text(v, "tool_arguments", visit) if isinstance(v, str) else v}, visit)
    calls = each(members({"function": arguments, "custom": members({"input": text("tool_arguments")}, visit)}, visit))

    def messages(value: Any) -> Any:
        for message in value if isinstance(value, list) else ():
            if isinstance(message, dict):
                surface = "tool_results" if message.get("role") in ("tool", "function") else "text"
                handlers = {"content": content(surface), "name": text(surface), "refusal": text(surface), "reasoning_content": text(surface)}
                visit_members(message, {**handlers, "tool_calls": calls, "function_call": arguments}, visit)
        return value

    handlers: dict[str, Handler] = {
        "tools": each(members({"function": function, "custom": members({"description": text("tool_descriptions")}, visit)}, visit)),
        "functions": each(function),
        "response_format": members(
            {"json_schema": members({"description": text("tool_descriptions"), "schema": lambda v: visit_schema(v, visit)}, visit)}, visit
        ),
        "messages": messages,
        "prediction": members({"content": content("text")}, visit),
        "stop": text("text"),
        "user": text("text"),
        "safety_identifier": text("text"),
        "prompt_cache_key": text("text"),
        "metadata": text("text"),
    }
    visit_members(body, handlers, visit)
    return opaque


def visit_answer(completion: dict[str, Any], visit: TextVisitor) -> None:
    """Visits each choice's text, refusal and tool-call arguments."""
    for choice in completion.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for field in ("content", "refusal"):
            if isinstance(message.get(field), str):
                message[field] = visit("text", message[field])
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                function["arguments"] = visit_json_text(function["arguments"], "tool_arguments", visit)


def stream_texts(chunk: Mapping[str, Any]) -> list[StreamText]:
    """The text a chunk adds, per choice: its content, refusal and each tool call's
    arguments are separate channels."""
    texts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        index = choice.get("index", 0)
        for field in ("content", "refusal"):
            if isinstance(delta.get(field), str):
                texts.append(StreamText((index, field), delta, field))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                texts.append(StreamText((index, "tool", call.get("index", 0)), function, "arguments", json=True))
    return texts


def stream_ends(chunk: Mapping[str, Any]) -> list[Any]:
    """The choices a chunk finishes: each closes the channels of its own index."""
    return [choice.get("index", 0) for choice in chunk.get("choices") or [] if isinstance(choice, dict) and choice.get("finish_reason") is not None]
