"""Anthropic Messages: the text of a request and of an answer, by surface, and where
the gateway adds its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import Inserted
from portcullis.adapters.protocols.text import (
    ALL_CHANNELS,
    PROVIDER_RUN,
    StreamText,
    TextVisitor,
    content_kind,
    read_strings,
    visit_leaves,
    visit_members,
    visit_schema,
    wrap_untrusted,
)
from portcullis.engine.conversation import Conversation, asks_reasoning, conversation_of, texts_of
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pii.policy import SIGNED

# Blocks the provider itself produced and encrypted; they go back unchanged, unread.
_PROVIDER_OPAQUE = frozenset({"redacted_thinking"})
_TOOL_CALLS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
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


def visit_answer(document: dict[str, Any], visit: TextVisitor) -> None:
    """Visits the text and tool input of a response; its thinking is read (surface
    ``signed``) and never changed."""
    for block in document.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
            visit(SIGNED, block["thinking"])
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            block["text"] = visit("text", block["text"])
        elif block.get("type") in _TOOL_CALLS and "input" in block:
            # The client runs tool_use; server and MCP calls already ran at the provider.
            surface = "tool_arguments" if block["type"] == "tool_use" else PROVIDER_RUN
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


_TEXT = frozenset({"text"})


def conversation(body: Mapping[str, Any]) -> Conversation:
    """The request as a conversation; a user message of tool results only is a tool turn."""
    system = body.get("system")
    messages = []
    for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
        if isinstance(message, dict):
            content = message.get("content")
            tool_turn = isinstance(content, list) and bool(content) and all(isinstance(b, dict) and b.get("type") in _TOOL_RESULTS for b in content)
            role = "tool" if tool_turn else ("assistant" if message.get("role") == "assistant" else "user")
            messages.append((role, texts_of(content, _TEXT)))
    return conversation_of(list(texts_of(system, _TEXT)), messages, asks_reasoning(body.get("thinking"), "type", ("disabled", None)))
