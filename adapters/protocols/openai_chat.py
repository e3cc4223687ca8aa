"""OpenAI Chat Completions (``POST /v1/chat/completions``), as ingress and as egress.
As egress it serves any OpenAI-compatible server (OpenAI, vLLM, ...)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols import (
    DEFAULT_LIMITS,
    OPENAI_CHAT,
    Inserted,
    ParsedRequest,
    RequestLimits,
    invalid,
    openai_chat_validator,
    optional_bool,
    optional_list,
    optional_positive_int,
    parse_json_object,
    require_list,
    require_string,
)
from portcullis.adapters.protocols.sse import SSEEvent, encode, event_of
from portcullis.adapters.protocols.text import (
    MAX_HELD_TOOL_CALL_BYTES,
    TOO_LARGE_TO_INSPECT,
    Handler,
    StreamText,
    TextVisitor,
    ToolCall,
    content_kind,
    denial_text,
    each,
    members,
    tool_call,
    visit_json_text,
    visit_leaves,
    visit_members,
    visit_schema,
    wrap_untrusted,
)
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity.spotlight import Boundary
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
    ErrorKind.METHOD_NOT_ALLOWED: ("invalid_request_error", None),
    ErrorKind.REQUEST_TIMEOUT: ("invalid_request_error", "timeout"),
    ErrorKind.REQUEST_TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.HEADERS_TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.RATE_LIMITED: ("rate_limit_error", "rate_limit_exceeded"),
    ErrorKind.INTERNAL: ("server_error", None),
    ErrorKind.UPSTREAM: ("server_error", None),
    ErrorKind.UNAVAILABLE: ("server_error", None),
    ErrorKind.TIMEOUT: ("server_error", "timeout"),
}


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS) -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    messages = require_list(body, "messages")
    if not messages:
        raise invalid("messages: must contain at least one message")
    stream = optional_bool(body, "stream")
    current, legacy = optional_positive_int(body, "max_completion_tokens"), optional_positive_int(body, "max_tokens")
    max_tokens = current or legacy
    choices = optional_positive_int(body, "n") or 1
    images = openai_chat_validator.validate(body, limits)
    tools = optional_list(body, "tools")
    requires = ["streaming"] if stream else []
    if tools:
        requires.append("tools")
    if images:
        requires.append("vision")
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, choices=choices, tools=declared_tools(body))


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
    return {"message": error.message, "type": kind, "param": None, "code": native_code or error.error_code}


# --- egress -----------------------------------------------------------------------


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes, with the model swapped when the names differ; when the
    output must stay within ``ceiling``, an output limit set to it if missing or larger;
    and, for a stream, usage requested (the gateway must price every stream; the extra
    usage chunk is withheld from clients that did not ask for it)."""
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
_ROLE_SURFACES = {"system": "system", "developer": "system", "assistant": "assistant", "tool": "tool_results", "function": "tool_results"}


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
                surface = _ROLE_SURFACES.get(message.get("role"), "user")
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
    """Visits each choice's text, refusal, reasoning (Chat's is unsigned) and tool-call
    arguments (function, custom and legacy function_call)."""
    for choice in completion.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for field in ("reasoning_content", "content", "refusal"):
            if isinstance(message.get(field), str):
                message[field] = visit("text", message[field])
        calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
        for function in [call.get("function") for call in calls] + [message.get("function_call")]:
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                function["arguments"] = visit_json_text(function["arguments"], "tool_arguments", visit)
        for custom in [call.get("custom") for call in calls]:
            if isinstance(custom, dict) and isinstance(custom.get("input"), str):
                custom["input"] = visit("tool_arguments", custom["input"])


def stream_texts(chunk: Mapping[str, Any]) -> list[StreamText]:
    """The text a chunk adds, per choice: its content, refusal and each tool call's
    arguments are separate channels."""
    texts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        index = choice.get("index", 0)
        for field in ("reasoning_content", "content", "refusal"):
            if isinstance(delta.get(field), str):
                texts.append(StreamText((index, field), delta, field))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            custom = call.get("custom") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                texts.append(StreamText((index, "tool", call.get("index", 0)), function, "arguments", json=True, arguments=True))
            elif isinstance(custom, dict) and isinstance(custom.get("input"), str):
                texts.append(StreamText((index, "tool", call.get("index", 0)), custom, "input", arguments=True))
        legacy = delta.get("function_call")
        if isinstance(legacy, dict) and isinstance(legacy.get("arguments"), str):
            texts.append(StreamText((index, "function_call"), legacy, "arguments", json=True, arguments=True))
    return texts


def provider_run_block(chunk: Mapping[str, Any]) -> Any:
    """Chat answers carry no calls the provider ran itself."""
    return None


def stream_ends(chunk: Mapping[str, Any]) -> list[Any]:
    """The choices a chunk finishes: each closes the channels of its own index."""
    return [choice.get("index", 0) for choice in chunk.get("choices") or [] if isinstance(choice, dict) and choice.get("finish_reason") is not None]


# --- prompt integrity -----------------------------------------------------------------


def insert_system_prompt(body: dict[str, Any], text: str) -> None:
    """The policy prompt as a message of its own in front of the conversation, in the
    role the client uses for instructions (``developer`` or ``system``)."""
    messages = body["messages"]
    role = "developer" if any(isinstance(m, dict) and m.get("role") == "developer" for m in messages) else "system"
    messages.insert(0, Inserted(role=role, content=text))


def leading_instructions(body: Mapping[str, Any]) -> str | None:
    """The text of a leading system or developer message (or of its first text part):
    where a policy prompt would be."""
    messages = body.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    if first.get("role") not in ("system", "developer"):
        return None
    content = first.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict) and content[0].get("type") == "text":
        content = content[0].get("text")
    return content if isinstance(content, str) else None


def declared_tools(body: Mapping[str, Any]) -> list[str]:
    """The names of the tools (and legacy functions) a request offers the model."""
    names = []
    for tool in body.get("tools") or ():
        spec = (tool.get("function") or tool.get("custom")) if isinstance(tool, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            names.append(spec["name"])
    names += [f["name"] for f in body.get("functions") or () if isinstance(f, dict) and isinstance(f.get("name"), str)]
    return names


def spotlight(body: dict[str, Any], boundary: Boundary, sources: frozenset[str]) -> int:
    """Wraps each tool message's content in untrusted boundaries; returns how many.
    Chat has no separate document type: retrieved text a client puts in user turns is
    the client's to mark."""
    if "tool_results" not in sources:
        return 0
    names: dict[Any, Any] = {}
    wrapped = 0
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or () if message.get("role") == "assistant" else ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                names[call.get("id")] = call["function"].get("name")
        if message.get("role") not in ("tool", "function") or message.get("content") is None:
            continue
        call_id = message.get("tool_call_id")
        inside = wrap_untrusted(message["content"], boundary, "tool_result", tool=names.get(call_id) or message.get("name"), id=call_id)
        if inside is not None:
            message["content"] = inside
            wrapped += 1
    return wrapped


# A call's key: (choice position, call index), or (choice, LEGACY) for a legacy
# ``function_call``, which a message holds at most once.
LEGACY = -1


def answer_tool_calls(completion: Mapping[str, Any]) -> list[tuple[tuple[int, int], ToolCall]]:
    """Every choice's calls: function and custom tool calls, and a legacy function_call."""
    calls = []
    for c, choice in enumerate(completion.get("choices") or ()):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for i, call in enumerate(message.get("tool_calls") or ()):
            calls.append(((c, i), _call_of(call)))
        if message.get("function_call") is not None:
            calls.append(((c, LEGACY), _call_of({"function": message["function_call"]})))
    return calls


def _call_of(entry: Any) -> ToolCall:
    """A tool-call entry: ``function`` (arguments as JSON text) or ``custom`` (free-form
    input, judged as the argument ``input``). Anything else has no name to allow."""
    entry = entry if isinstance(entry, dict) else {}
    if isinstance(entry.get("custom"), dict):
        custom = entry["custom"]
        return ToolCall(custom.get("name") if isinstance(custom.get("name"), str) else "", {"input": custom.get("input")})
    function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
    return tool_call(function.get("name"), function.get("arguments"))


def deny_tool_calls(completion: dict[str, Any], denials: Mapping[tuple[int, int], str]) -> None:
    """Denied calls leave the message and their texts join its content; a choice left
    without a call stops instead of asking for tools."""
    for c, choice in enumerate(completion["choices"]):
        texts = [text for (dc, _), text in sorted(denials.items()) if dc == c]
        if not texts:
            continue
        message = choice["message"]
        kept = [call for i, call in enumerate(message.get("tool_calls") or ()) if (c, i) not in denials]
        message["content"] = "\n\n".join([message["content"], *texts] if message.get("content") else texts)
        if kept:
            message["tool_calls"] = kept
        else:
            message.pop("tool_calls", None)
        if (c, LEGACY) in denials:
            message.pop("function_call", None)
        if not kept and choice.get("finish_reason") in ("tool_calls", "function_call") and message.get("function_call") is None:
            choice["finish_reason"] = "stop"


class ToolCallStream:
    """From a choice's first tool-call delta until its finish_reason every chunk is
    held (in order); then each call is judged whole. Allowed calls go out as they came
    (renumbered when one before them was denied); a denied call's deltas are dropped
    and its text goes out as content before the finishing chunk. A call that grows
    past ``MAX_HELD_TOOL_CALL_BYTES`` is denied there: its deltas are dropped as they
    arrive, and the stream is still held until the choice finishes."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[tuple[SSEEvent, dict[str, Any] | None]] = []
        self._calls: dict[tuple[int, int], dict[str, Any]] = {}
        self._too_large: set[tuple[int, int]] = set()
        self._open: set[int] = set()
        self._size = 0

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if not self._held and "tool_calls" not in event.data and "function_call" not in event.data:
            return [event]
        document = None if event.data == "[DONE]" else event.json()
        for choice in (document or {}).get("choices") or ():
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            listed = delta.get("tool_calls") if isinstance(delta.get("tool_calls"), list) else ()  # servers may send null
            pieces = [((index, call.get("index", 0)), call) for call in listed if isinstance(call, dict)]
            if isinstance(delta.get("function_call"), dict):
                pieces.append(((index, LEGACY), {"function": delta["function_call"]}))
            for key, call in pieces:
                self._open.add(index)
                if key in self._too_large:
                    continue
                state = self._calls.setdefault(key, {"name": "", "parts": [], "custom": False})
                spec = call.get("custom") if isinstance(call.get("custom"), dict) else call.get("function") or {}
                state["custom"] = state["custom"] or isinstance(call.get("custom"), dict)
                state["name"] += spec.get("name") or ""
                piece = spec.get("input") if state["custom"] else spec.get("arguments")
                state["parts"].append(piece if isinstance(piece, str) else "")
                state["size"] = state.get("size", 0) + len(state["parts"][-1])
                self._size += len(state["parts"][-1])
                if self._size > MAX_HELD_TOOL_CALL_BYTES:
                    self._deny_too_large(key)
            if choice.get("finish_reason") is not None:
                self._open.discard(index)
        self._held.append((event, self._without(document, self._too_large, {})))
        if self._open and document is not None:
            return []
        return self._release()

    def finish(self) -> list[SSEEvent]:
        return self._release() if self._held else []

    def _deny_too_large(self, key: tuple[int, int]) -> None:
        """The call that outgrew the limit is denied now; what it held is dropped (the
        held events are written again from their documents, so its bytes go too)."""
        self._too_large.add(key)
        self._size -= self._calls[key].get("size", 0)
        self._calls[key]["parts"] = []
        self._held = [(event if document is None else event_of(self._without(document, {key}, {})), document) for event, document in self._held]

    def _release(self) -> list[SSEEvent]:
        denied: dict[tuple[int, int], str] = {}
        for key, state in self._calls.items():
            text = "".join(state["parts"])
            call = ToolCall(state["name"], {"input": text}) if state["custom"] else tool_call(state["name"], text)
            reason = TOO_LARGE_TO_INSPECT if key in self._too_large else self._judge(call)
            if reason is not None:
                denied[key] = denial_text(call, reason)
        held, calls = self._held, self._calls
        self._held, self._calls, self._open, self._size = [], {}, set(), 0
        if not denied:
            return [event for event, _ in held]
        kept = {c: sorted(i for (cc, i) in calls if cc == c and i != LEGACY and (cc, i) not in denied) for c, _ in calls}
        renumber = {(c, old): new for c, indexes in kept.items() for new, old in enumerate(indexes)}
        noted: set[int] = set()
        out = []
        for event, document in held:
            if document is None:  # [DONE]: a choice that never finished still gets its note
                out += [self._note(held, c, denied) for c in sorted({c for c, _ in denied} - noted)]
                noted |= {c for c, _ in denied}
                out.append(event)
                continue
            document = self._without(document, set(denied), renumber)
            for choice in document.get("choices") or ():
                c = choice.get("index", 0)
                if choice.get("finish_reason") is not None and any(dc == c for dc, _ in denied) and c not in noted:
                    out.append(self._note(held, c, denied))
                    noted.add(c)
                    still_calls = kept.get(c) or ((c, LEGACY) in calls and (c, LEGACY) not in denied)
                    if choice["finish_reason"] in ("tool_calls", "function_call") and not still_calls:
                        choice["finish_reason"] = "stop"
            out.append(event_of(document))
        out += [self._note(held, c, denied) for c in sorted({c for c, _ in denied} - noted)]
        return out

    @staticmethod
    def _without(document: dict[str, Any] | None, dropped: set[tuple[int, int]], renumber: Mapping[tuple[int, int], int]) -> Any:
        """The chunk without the deltas of ``dropped`` calls, the rest renumbered."""
        for choice in (document or {}).get("choices") or ():
            c, delta = choice.get("index", 0), choice.get("delta") or {}
            if isinstance(delta.get("tool_calls"), list):
                delta["tool_calls"] = [
                    dict(call, index=renumber.get((c, call.get("index", 0)), call.get("index", 0)))
                    for call in delta["tool_calls"]
                    if isinstance(call, dict) and (c, call.get("index", 0)) not in dropped
                ]
                if not delta["tool_calls"]:
                    del delta["tool_calls"]
            if (c, LEGACY) in dropped:
                delta.pop("function_call", None)
        return document

    @staticmethod
    def _note(held: list[tuple[SSEEvent, dict[str, Any] | None]], choice: int, denied: Mapping[tuple[int, int], str]) -> SSEEvent:
        """The denial texts of a choice, as a content chunk shaped like the stream's own."""
        template = next((document for _, document in held if document is not None), {})
        texts = [text for (c, _), text in sorted(denied.items()) if c == choice]
        note = {k: v for k, v in template.items() if k not in ("choices", "usage")}
        return event_of({**note, "choices": [{"index": choice, "delta": {"content": "\n\n".join(texts)}, "finish_reason": None}]})
