"""OpenAI Responses: the text of a request and of an answer, by surface, and where the
gateway adds its own.

A stream repeats its text: deltas, then each ``.done`` event, the finished item and
the final response carry it whole. Every copy is a piece of its own channel, so a
filter changes each the same way and a client that rebuilds the answer from any of
them (Codex reads ``response.output_item.done``) sees the same text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.text import (
    ALL_CHANNELS,
    PROVIDER_RUN,
    Handler,
    StreamText,
    TextVisitor,
    content_kind,
    each,
    members,
    read_strings,
    visit_json_text,
    visit_leaves,
    visit_members,
    visit_schema,
    wrap_untrusted,
)
from portcullis.engine.conversation import Conversation, asks_reasoning, conversation_of, texts_of
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pii.policy import SIGNED

_ROLE_SURFACES = {"system": "system", "developer": "system", "assistant": "assistant"}
_UNINSPECTABLE_PARTS = {"input_image": "image", "input_file": "file", "input_audio": "audio"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_BINARY = ("image_url", "file_data", "input_audio")
_CALL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
# Output items of tools the provider runs itself: their calls happen before the gateway sees them.
PROVIDER_RUN_ITEMS = frozenset({"web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call", "mcp_call", "mcp_list_tools"})
_FINAL = ("response.completed", "response.incomplete", "response.failed")


def visit_prompt(body: dict[str, Any], visit: TextVisitor) -> list[str]:
    """Visits every string of the request the model will read, in the order it reads
    them (tools, instructions, input), so placeholders number in prompt order and a new
    turn never renumbers an earlier one. Returns the kinds of content that cannot be
    inspected (images, files, audio, unknown parts)."""
    opaque: list[str] = []

    def text(surface: str) -> Handler:
        return lambda value: visit(surface, value) if isinstance(value, str) else visit_leaves(value, surface, visit)

    def content(surface: str) -> Handler:
        def handle(value: Any) -> Any:
            if not isinstance(value, list):
                return text(surface)(value)
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in _TEXT_PARTS:
                    visit_members(part, {_TEXT_PARTS[kind]: text(surface)}, visit)
                else:  # an image's or a file's data is not read; what names it is
                    opaque.append(_UNINSPECTABLE_PARTS.get(kind) or content_kind(kind))
                    read_strings({k: v for k, v in part.items() if k not in _BINARY} if isinstance(part, dict) else part, visit)
            return value

        return handle

    def signed(value: Any) -> Any:
        read_strings(value, visit, SIGNED)  # the provider decrypts and checks it: never changed
        return value

    def item(value: Any) -> Any:
        if not isinstance(value, dict):
            read_strings(value, visit)
            return value
        kind = value.get("type")
        if kind in (None, "message"):
            visit_members(value, {"content": content(_ROLE_SURFACES.get(value.get("role"), "user"))}, visit)
        elif kind in ("function_call", "mcp_call"):
            surface = "tool_arguments" if kind == "function_call" else PROVIDER_RUN
            visit_members(value, {"arguments": lambda v: visit_json_text(v, surface, visit) if isinstance(v, str) else v}, visit)
        elif kind == "custom_tool_call":
            visit_members(value, {"input": text("tool_arguments")}, visit)
        elif kind in _CALL_OUTPUTS:
            visit_members(value, {"output": content("tool_results")}, visit)
        elif kind == "reasoning":
            visit_members(value, {"summary": signed, "content": signed, "encrypted_content": signed}, visit)
        else:
            read_strings(value, visit)
        return value

    def tool(value: Any) -> Any:
        handlers: dict[str, Handler] = {"description": text("tool_descriptions"), "parameters": lambda v: visit_schema(v, visit), "tools": each(tool)}
        return members(handlers, visit)(value)

    def items(value: Any) -> Any:
        return visit("user", value) if isinstance(value, str) else each(item)(value)

    handlers: dict[str, Handler] = {
        "tools": each(tool),
        "text": members({"format": members({"description": text("tool_descriptions"), "schema": lambda v: visit_schema(v, visit)}, visit)}, visit),
        "instructions": text("system"),
        "input": items,
        "user": text("text"),
        "safety_identifier": text("text"),
        "prompt_cache_key": text("text"),
        "metadata": text("text"),
    }
    visit_members(body, handlers, visit)
    return opaque


def visit_answer(document: dict[str, Any], visit: TextVisitor) -> None:
    """Visits each output item's text: message parts, client-run calls' arguments,
    provider-run calls (read as run) and reasoning (signed, never changed)."""
    for item in document.get("output") or []:
        if isinstance(item, dict):
            _visit_output_item(item, visit)


def _visit_output_item(item: dict[str, Any], visit: TextVisitor) -> None:
    kind = item.get("type")
    if kind == "message":
        for part in item.get("content") or ():
            field = _TEXT_PARTS.get(part.get("type")) if isinstance(part, dict) else None
            if field and isinstance(part.get(field), str):
                part[field] = visit("text", part[field])
    elif kind == "function_call" and isinstance(item.get("arguments"), str):
        item["arguments"] = visit_json_text(item["arguments"], "tool_arguments", visit)
    elif kind == "custom_tool_call" and isinstance(item.get("input"), str):
        item["input"] = visit("tool_arguments", item["input"])
    elif kind == "reasoning":
        read_strings([item.get("summary"), item.get("content")], visit, SIGNED)
    elif kind in PROVIDER_RUN_ITEMS:
        read_strings({k: v for k, v in item.items() if k not in ("result", "output")}, visit, PROVIDER_RUN)


# --- streams ----------------------------------------------------------------------------------


def stream_texts(event: Mapping[str, Any]) -> list[StreamText]:
    """The text an event carries: deltas continue their item's channel; a ``.done``
    event, a finished item and the final response carry whole copies, each its own
    channel. Reasoning is signed; call arguments are the tool-call guard's."""
    kind = event.get("type")
    at = event.get("output_index")
    if not isinstance(kind, str):
        return []
    if kind in _FINAL:
        response = event.get("response")
        output = response.get("output") if isinstance(response, dict) else None
        return [piece for i, item in enumerate(output or ()) if isinstance(item, dict) for piece in _item_texts(item, ("response", i), True)]
    if kind in ("response.output_item.added", "response.output_item.done"):
        item = event.get("item")
        return _item_texts(item, (at, kind), kind.endswith(".done")) if isinstance(item, dict) else []
    if kind in ("response.content_part.added", "response.content_part.done"):
        part = event.get("part")
        return _part_texts(part, (at, kind, event.get("content_index")), kind.endswith(".done")) if isinstance(part, dict) else []
    pieces = _DELTAS.get(kind)
    if pieces is None:
        return []
    key, flags, done = pieces
    channel = (at, kind.rsplit(".", 2)[1], event.get("content_index", event.get("summary_index")), *(("done",) if done else ()))
    return [StreamText(channel, event, key, repeat=done, **flags)] if isinstance(event.get(key), str) else []


_ARGUMENTS = {"json": True, "arguments": True}
_DELTAS: dict[str, tuple[str, dict[str, bool], bool]] = {
    "response.output_text.delta": ("delta", {}, False),
    "response.output_text.done": ("text", {}, True),
    "response.refusal.delta": ("delta", {}, False),
    "response.refusal.done": ("refusal", {}, True),
    "response.function_call_arguments.delta": ("delta", _ARGUMENTS, False),
    "response.function_call_arguments.done": ("arguments", _ARGUMENTS, True),
    "response.mcp_call_arguments.delta": ("delta", _ARGUMENTS, False),
    "response.mcp_call_arguments.done": ("arguments", _ARGUMENTS, True),
    "response.custom_tool_call_input.delta": ("delta", {"arguments": True}, False),
    "response.custom_tool_call_input.done": ("input", {"arguments": True}, True),
    "response.reasoning_summary_text.delta": ("delta", {"signed": True}, False),
    "response.reasoning_summary_text.done": ("text", {"signed": True}, True),
    "response.reasoning_text.delta": ("delta", {"signed": True}, False),
    "response.reasoning_text.done": ("text", {"signed": True}, True),
}


def _item_texts(item: dict[str, Any], channel: tuple[Any, ...], repeat: bool) -> list[StreamText]:
    kind = item.get("type")
    if kind == "message":
        parts = item.get("content") or ()
        return [piece for k, part in enumerate(parts) if isinstance(part, dict) for piece in _part_texts(part, (*channel, k), repeat)]
    if kind in ("function_call", "mcp_call") and isinstance(item.get("arguments"), str):
        return [StreamText((*channel, "arguments"), item, "arguments", json=True, arguments=True, repeat=repeat)]
    if kind == "custom_tool_call" and isinstance(item.get("input"), str):
        return [StreamText((*channel, "input"), item, "input", arguments=True, repeat=repeat)]
    if kind == "reasoning":
        parts = [part for part in (item.get("summary") or []) + (item.get("content") or []) if isinstance(part, dict)]
        texts = [(k, part) for k, part in enumerate(parts) if isinstance(part.get("text"), str)]
        return [StreamText((*channel, "reasoning", k), part, "text", signed=True, repeat=repeat) for k, part in texts]
    return []


def _part_texts(part: dict[str, Any], channel: tuple[Any, ...], repeat: bool) -> list[StreamText]:
    field = _TEXT_PARTS.get(part.get("type"))
    if field and isinstance(part.get(field), str):
        return [StreamText(channel, part, field, repeat=repeat)]
    if part.get("type") in ("summary_text", "reasoning_text") and isinstance(part.get("text"), str):
        return [StreamText(channel, part, "text", signed=True, repeat=repeat)]
    return []


def provider_run_block(event: Mapping[str, Any]) -> Any:
    """The output index of an item this event opens for a call the provider runs
    itself (web search, file search, code interpreter, MCP, ...), else None."""
    item = event.get("item") if event.get("type") == "response.output_item.added" else None
    index = event.get("output_index")
    return index if isinstance(index, int) and isinstance(item, dict) and item.get("type") in PROVIDER_RUN_ITEMS else None


def stream_ends(event: Mapping[str, Any]) -> list[Any]:
    """A finished item closes every channel of its output index; the final event all."""
    kind = event.get("type")
    if kind == "response.output_item.done":
        return [event.get("output_index")]
    return [ALL_CHANNELS] if kind in _FINAL or kind == "error" else []


# --- the gateway's own text ---------------------------------------------------------------------

# Two blank lines end the policy prompt: its own paragraphs are separated by one, so the
# whole prompt is found again (a gateway hop) even when it has several.
PROMPT_END = "\n\n\n"


def insert_system_prompt(body: dict[str, Any], text: str) -> None:
    """The policy prompt leading ``instructions``, where the model reads the system's
    text first; the client's instructions follow it unchanged, so their bytes (and a
    provider's prompt cache over them) stay stable. Not a developer item in ``input``:
    the model would read that after the client's instructions."""
    instructions = body.get("instructions")
    body["instructions"] = f"{text}{PROMPT_END}{instructions}" if isinstance(instructions, str) and instructions else text


def leading_instructions(body: Mapping[str, Any]) -> str | None:
    """What ``instructions`` holds before its first two blank lines: where a policy
    prompt would be."""
    instructions = body.get("instructions")
    return instructions.partition(PROMPT_END)[0] if isinstance(instructions, str) else None


def declared_tools(body: Mapping[str, Any]) -> list[str]:
    """The names of the tools a request offers the model: functions and custom tools by
    name, a namespace's tools as ``namespace.name``; built-in tools the provider runs
    (``web_search``, ``file_search``, ...) as ``server:<type>``: policy can allow or
    refuse them, never judge their calls."""
    names: list[str] = []
    for tool in body.get("tools") or ():
        names += _tool_names(tool, "")
    return names


def _tool_names(tool: Any, prefix: str) -> list[str]:
    if not isinstance(tool, dict):
        return []
    kind, name = tool.get("type"), tool.get("name")
    if kind == "namespace":
        inner = f"{prefix}{name}." if isinstance(name, str) else prefix
        return [found for member in tool.get("tools") or () for found in _tool_names(member, inner)]
    if kind in ("function", "custom"):
        return [f"{prefix}{name}"] if isinstance(name, str) else []
    if kind == "mcp":
        label = tool.get("server_label")
        return [f"mcp:{label if isinstance(label, str) else ''}"]
    return [f"server:{kind}"] if isinstance(kind, str) else []


def spotlight(body: dict[str, Any], boundary: Boundary, sources: frozenset[str]) -> int:
    """Wraps each function and custom tool call's output in untrusted boundaries;
    returns how many."""
    if "tool_results" not in sources or not isinstance(body.get("input"), list):
        return 0
    names = {
        item.get("call_id"): item.get("name")
        for item in body["input"]
        if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call")
    }
    wrapped = 0
    for item in body["input"]:
        if not isinstance(item, dict) or item.get("type") not in _CALL_OUTPUTS or item.get("output") is None:
            continue
        call_id = item.get("call_id")
        inside = _wrap(item["output"], boundary, names.get(call_id), call_id)
        if inside is not None:
            item["output"] = inside
            wrapped += 1
    return wrapped


def _wrap(output: Any, boundary: Boundary, tool: Any, call_id: Any) -> Any:
    """A string output wrapped whole; a list of parts between two ``input_text`` parts."""
    name = tool if isinstance(tool, str) else None
    ident = call_id if isinstance(call_id, str) else None
    if isinstance(output, list):
        wrapped = wrap_untrusted(output, boundary, "tool_result", tool=name, id=ident)
        return [dict(part, type="input_text") if part.get("type") == "text" else part for part in wrapped] if wrapped else None
    return wrap_untrusted(output, boundary, "tool_result", tool=name, id=ident)


_TEXT = frozenset({"input_text", "output_text", "text"})


def conversation(body: Mapping[str, Any]) -> Conversation:
    """The request as a conversation: ``instructions`` and system / developer items are
    its system texts; a tool's output item is a tool turn."""
    instructions = body.get("instructions")
    system = [instructions] if isinstance(instructions, str) else []
    items = body.get("input")
    messages = []
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "message" and role in ("system", "developer"):
            system.extend(texts_of(item.get("content"), _TEXT))
        elif kind == "message":
            messages.append(("assistant" if role == "assistant" else "user", texts_of(item.get("content"), _TEXT)))
        elif isinstance(kind, str) and kind.endswith("_output"):  # function_call_output, custom_tool_call_output, …
            messages.append(("tool", ()))
        else:  # the model's own items sent back (calls, reasoning)
            messages.append(("assistant", ()))
    return conversation_of(system, messages, asks_reasoning(body.get("reasoning"), "effort", ("none", None)))
