"""Anthropic Messages (``POST /v1/messages``), as ingress and as egress."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols import (
    ANTHROPIC_MESSAGES,
    DEFAULT_LIMITS,
    Inserted,
    ParsedRequest,
    RequestLimits,
    anthropic_messages_validator,
    forwarded_headers,
    invalid,
    optional_bool,
    optional_list,
    optional_positive_int,
    parse_json_object,
    require_string,
)
from portcullis.adapters.protocols.sse import SSEEvent, encode, event_of
from portcullis.adapters.protocols.text import (
    ALL_CHANNELS,
    MAX_HELD_TOOL_CALL_BYTES,
    TOO_LARGE_TO_INSPECT,
    StreamText,
    TextVisitor,
    ToolCall,
    content_kind,
    denial_text,
    read_strings,
    tool_call,
    visit_leaves,
    visit_members,
    visit_schema,
    wrap_untrusted,
)
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pii.policy import SIGNED
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
    ErrorKind.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorKind.REQUEST_TIMEOUT: "timeout_error",
    ErrorKind.REQUEST_TOO_LARGE: "request_too_large",
    ErrorKind.HEADERS_TOO_LARGE: "request_too_large",
    ErrorKind.RATE_LIMITED: "rate_limit_error",
    ErrorKind.INTERNAL: "api_error",
    ErrorKind.UPSTREAM: "api_error",
    ErrorKind.UNAVAILABLE: "api_error",
    ErrorKind.TIMEOUT: "timeout_error",
}


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS) -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    max_tokens = optional_positive_int(body, "max_tokens")
    stream = optional_bool(body, "stream")
    needs = anthropic_messages_validator.validate(body, limits)
    if max_tokens is None:
        raise invalid("max_tokens: field required")
    tools = optional_list(body, "tools")
    thinking = body.get("thinking")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if thinking and thinking.get("type") in ("enabled", "adaptive"):
        requires.append("thinking")
    requires.extend(sorted(needs))
    forward = forwarded_headers(headers, FORWARDED_HEADERS, limits)
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, forward, _beta_query(query), tools=declared_tools(body))


def _beta_query(query: str) -> str:
    # Claude Code calls /v1/messages?beta=true; nothing else in a query is forwarded.
    return "beta=true" if "beta=true" in query.split("&") else ""


# --- errors -----------------------------------------------------------------------


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"type": "error", "error": _error_object(error), "request_id": request_id}).encode()


def stream_error(error: GatewayError) -> bytes:
    return encode({"type": "error", "error": _error_object(error)}, "error")


def _error_object(error: GatewayError) -> dict[str, Any]:
    # ``code`` is Portcullis's own: the SDKs keep extra members of ``error`` (body, .error).
    return {"type": _ERROR_TYPES[error.kind], "message": error.message, "code": error.error_code}


# --- egress -----------------------------------------------------------------------


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json", "anthropic-version": forward.get("anthropic-version", DEFAULT_VERSION)}
    if "anthropic-beta" in forward:
        headers["anthropic-beta"] = forward["anthropic-beta"]
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes, with only the model swapped when the names differ and, when
    the output must stay within ``ceiling``, a larger max_tokens lowered to it."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if ceiling is not None and (request.max_tokens or 0) > ceiling:
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


# --- prompt and answer text -----------------------------------------------------------

# Blocks the provider itself produced and encrypted; they go back unchanged, unread.
_PROVIDER_OPAQUE = frozenset({"redacted_thinking"})
_TOOL_CALLS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
PROVIDER_TOOL_ARGUMENTS = "provider_tool_arguments"  # an answer's calls the provider itself ran
_TOOL_RESULTS = frozenset({"tool_result", "mcp_tool_result"})


def visit_prompt(body: dict[str, Any], visit: TextVisitor) -> list[str]:
    """Visits every string of the request the model will read, in the order it reads
    them (tools first), so placeholders number in prompt order and a new turn never
    renumbers an earlier one. Returns the kinds of content that cannot be inspected
    (images, binary documents, block types this gateway does not know)."""
    opaque: list[str] = []

    def blocks(surface: str) -> Callable[[Any], Any]:
        def handle(value: Any) -> Any:
            if isinstance(value, str):
                return visit(surface, value)
            if isinstance(value, list):
                _visit_blocks(value, surface, visit, opaque)
            else:
                read_strings(value, visit)
            return value

        return handle

    def messages(value: Any) -> Any:
        for message in value if isinstance(value, list) else ():
            if isinstance(message, dict):
                visit_members(message, {"content": blocks(_role_surface(message.get("role")))}, visit)
        return value

    def tools(value: Any) -> Any:
        for tool in value if isinstance(value, list) else ():
            if isinstance(tool, dict):
                visit_members(
                    tool,
                    {"description": lambda v: visit("tool_descriptions", v) if isinstance(v, str) else v, "input_schema": lambda v: visit_schema(v, visit)},
                    visit,
                )
        return value

    handlers = {
        "tools": tools,
        "system": blocks("system"),
        "messages": messages,
        "metadata": lambda v: visit_leaves(v, "text", visit),
        "stop_sequences": lambda v: visit_leaves(v, "text", visit),
    }
    visit_members(body, handlers, visit)
    return opaque


def _role_surface(role: Any) -> str:
    return "assistant" if role == "assistant" else "user"


def _visit_blocks(blocks: list[Any], surface: str, visit: TextVisitor, opaque: list[str]) -> None:
    for block in blocks:
        if not isinstance(block, dict):
            read_strings(block, visit)
            continue
        kind = block.get("type")
        leaves = lambda where: lambda value: visit_leaves(value, where, visit)  # noqa: E731
        if kind == "text":
            visit_members(block, {"text": leaves(surface), "citations": leaves(surface)}, visit)
        elif kind in _TOOL_CALLS:
            visit_members(block, {"input": leaves("tool_arguments")}, visit)
        elif kind in _TOOL_RESULTS:
            visit_members(block, {"content": lambda v: _tool_result(v, visit, opaque)}, visit)
        elif kind == "search_result":
            visit_members(
                block, {"title": leaves("tool_results"), "source": leaves("tool_results"), "content": lambda v: _tool_result(v, visit, opaque)}, visit
            )
        elif kind == "document":
            _visit_document(block, surface, visit, opaque)
        elif kind == "thinking":
            read_strings(block.get("thinking"), visit, SIGNED)  # the provider checks its signature: never changed
        elif kind == "image":
            opaque.append("image")
        elif kind not in _PROVIDER_OPAQUE:
            opaque.append(content_kind(kind))


def _tool_result(value: Any, visit: TextVisitor, opaque: list[str]) -> Any:
    if isinstance(value, str):
        return visit("tool_results", value)
    if isinstance(value, list):
        _visit_blocks(value, "tool_results", visit, opaque)
    return value


def _visit_document(block: dict[str, Any], surface: str, visit: TextVisitor, opaque: list[str]) -> None:
    source = block.get("source")
    handlers: dict[str, Callable[[Any], Any]] = {
        "title": lambda v: visit_leaves(v, surface, visit),
        "context": lambda v: visit_leaves(v, surface, visit),
        "source": lambda v: v,  # below: text is read and changed, binary data is opaque
    }
    visit_members(block, handlers, visit)
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        source["data"] = visit(surface, source["data"])
    elif isinstance(source, dict) and source.get("type") == "content" and isinstance(source.get("content"), list):
        _visit_blocks(source["content"], surface, visit, opaque)
    else:
        opaque.append("document")


def visit_answer(message: dict[str, Any], visit: TextVisitor) -> None:
    """Visits the text and tool input of a response; its thinking is read (surface
    ``signed``) and never changed."""
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
            visit(SIGNED, block["thinking"])
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            block["text"] = visit("text", block["text"])
        elif block.get("type") in _TOOL_CALLS and "input" in block:
            # The client runs tool_use; server and MCP calls already ran at the provider.
            surface = "tool_arguments" if block["type"] == "tool_use" else PROVIDER_TOOL_ARGUMENTS
            block["input"] = visit_leaves(block["input"], surface, visit)


def stream_texts(event: Mapping[str, Any]) -> list[StreamText]:
    """The text an event adds to a content block; thinking deltas are ``signed``."""
    if event.get("type") != "content_block_delta":
        return []
    delta = event.get("delta")
    if not isinstance(delta, dict):
        return []
    if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
        return [StreamText(event.get("index"), delta, "text")]
    if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        return [StreamText(event.get("index"), delta, "partial_json", json=True, arguments=True)]
    if delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
        return [StreamText(event.get("index"), delta, "thinking", signed=True)]
    return []


def provider_run_block(event: Mapping[str, Any]) -> Any:
    """The index of a content block this event opens for a call the provider runs
    itself (server tools, MCP), else None."""
    block = event.get("content_block") if event.get("type") == "content_block_start" else None
    index = event.get("index")
    return index if isinstance(index, int) and isinstance(block, dict) and block.get("type") in _TOOL_CALLS - {"tool_use"} else None


def stream_ends(event: Mapping[str, Any]) -> list[Any]:
    """The channels an event closes (``ALL_CHANNELS``: every one)."""
    kind = event.get("type")
    if kind == "content_block_stop":
        return [event.get("index")]
    return [ALL_CHANNELS] if kind in ("message_delta", "message_stop") else []


# --- prompt integrity -----------------------------------------------------------------


def insert_system_prompt(body: dict[str, Any], text: str) -> None:
    """The policy prompt as the first system block, its own block, so the client's
    blocks (and their cache_control breakpoints) follow it unchanged."""
    block = Inserted(type="text", text=text)
    system = body.get("system")
    if isinstance(system, list):
        system.insert(0, block)
    elif isinstance(system, str) and system:
        body["system"] = [block, {"type": "text", "text": system}]
    else:
        body["system"] = [block]


def leading_instructions(body: Mapping[str, Any]) -> str | None:
    """The text of the first system block: where a policy prompt would be."""
    system = body.get("system")
    if isinstance(system, str):
        return system
    first = system[0] if isinstance(system, list) and system else None
    return first.get("text") if isinstance(first, dict) and first.get("type") == "text" else None


# Tool types the provider runs itself: their calls happen before the gateway sees them.
_SERVER_TOOL_TYPES = ("web_search_", "web_fetch_", "code_execution_")


def declared_tools(body: Mapping[str, Any]) -> list[str]:
    """The names of the tools a request offers the model. Tools the provider runs are
    ``server:<name>``, MCP servers it connects to ``mcp:<name>``: policy can allow or
    refuse them, but never judge their calls."""
    names = []
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            kind = tool.get("type")
            server = isinstance(kind, str) and kind.startswith(_SERVER_TOOL_TYPES)
            names.append(f"server:{tool['name']}" if server else tool["name"])
    servers = body.get("mcp_servers")
    return names + [f"mcp:{server.get('name', '')}" for server in servers if isinstance(server, dict)] if isinstance(servers, list) else names


def spotlight(body: dict[str, Any], boundary: Boundary, sources: frozenset[str]) -> int:
    """Wraps tool results and documents in untrusted boundaries; returns how many.
    A tool result is wrapped inside its own content (tool results must lead their
    message); a document gets boundary text blocks around it."""
    names = {}  # tool_use id -> tool name, from the assistant turns
    wrapped = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        if message.get("role") == "assistant":
            names.update({b.get("id"): b.get("name") for b in content if isinstance(b, dict) and b.get("type") in _TOOL_CALLS})
            continue
        out: list[Any] = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in _TOOL_RESULTS and "tool_results" in sources and block.get("content") is not None:
                call = block.get("tool_use_id")
                inside = wrap_untrusted(block["content"], boundary, "tool_result", tool=names.get(call), id=call)
                if inside is not None:
                    block["content"] = inside
                    wrapped += 1
            elif kind in ("document", "search_result") and "documents" in sources:
                title = block.get("title") if isinstance(block.get("title"), str) else None
                out += wrap_untrusted([block], boundary, kind, title=title)
                wrapped += 1
                continue
            out.append(block)
        message["content"] = out
    return wrapped


def answer_tool_calls(message: Mapping[str, Any]) -> list[tuple[int, ToolCall]]:
    """The client-executed tool calls of an answer, by content position. Server tools
    run at the provider before the gateway sees them, so they are not the guard's."""
    return [
        (i, tool_call(block.get("name"), block.get("input")))
        for i, block in enumerate(message.get("content") or ())
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


def deny_tool_calls(message: dict[str, Any], denials: Mapping[int, str]) -> None:
    """Denied calls become text blocks; an answer left without a call ends its turn."""
    content = message["content"]
    for position, text in denials.items():
        content[position] = {"type": "text", "text": text}
    if message.get("stop_reason") == "tool_use" and not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        message["stop_reason"] = "end_turn"


class ToolCallStream:
    """Holds each tool_use block's events until its content_block_stop, then releases
    them, or a text block in its place when the judge denies the call."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._index: Any = None
        self._start: dict[str, Any] = {}
        self._parts: list[str] = []
        self._size = 0
        self._allowed = self._denied = 0
        self._dropping: Any = None  # a block denied before its end: its remaining events go

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._held:
            return self._holding(event)
        if self._dropping is not None and event.event in ("content_block_delta", "content_block_stop") and event.json().get("index") == self._dropping:
            if event.event == "content_block_stop":
                self._dropping = None
            return []
        if event.event == "content_block_start":
            document = event.json()
            block = document.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self._held, self._index, self._start = [event], document.get("index"), block
                self._parts, self._size = [], 0
                return []
        elif event.event == "message_delta" and self._denied and not self._allowed:
            document = event.json()
            delta = document.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                delta["stop_reason"] = "end_turn"
                return [event_of(document, event.event)]
        return [event]

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a tool call: the call never completed, so it is
        denied; what came after it that is not part of the block still goes out."""
        if not self._held:
            return []
        held, index = self._held, self._index
        out = self._decide("the call did not complete")
        self._dropping = None
        rest = [e for e in held[1:] if e.event not in ("content_block_delta", "content_block_stop") or e.json().get("index") != index]
        return out + [out_event for e in rest for out_event in self.feed(e)]

    def _holding(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        if event.event == "content_block_delta":
            delta = event.json().get("delta") or {}
            if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self._parts.append(delta["partial_json"])
        if event.event != "content_block_stop" or event.json().get("index") != self._index:
            if self._size > MAX_HELD_TOOL_CALL_BYTES:
                return self._decide(TOO_LARGE_TO_INSPECT)
            return []
        return self._decide(None)

    def _decide(self, refused: str | None) -> list[SSEEvent]:
        held, self._held = self._held, []
        arguments = "".join(self._parts) if self._parts else self._start.get("input")
        call = tool_call(self._start.get("name"), arguments)
        reason = refused or self._judge(call)
        if reason is None:
            self._allowed += 1
            return held
        self._denied += 1
        text = denial_text(call, reason)
        index = self._index
        if refused:  # decided before the block ended: the rest of it is dropped as it comes
            self._dropping = index
        return [
            event_of({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
            event_of({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}, "content_block_delta"),
            event_of({"type": "content_block_stop", "index": index}, "content_block_stop"),
        ]
