"""The Anthropic Messages ingress validator: every request field the gateway reads,
type-checked with the client's own path, and the request's size caps. Fields the
gateway does not read (``thinking`` options, ``context_management``, ``output_config``,
block fields it does not know, ...) pass through unchecked: the provider judges them."""

from __future__ import annotations

from typing import Any

from portcullis.adapters.protocols.validation import RequestLimits, Walk, wrong_type

_TOOL_CALLS = ("tool_use", "server_tool_use", "mcp_tool_use")
_TOOL_RESULTS = ("tool_result", "mcp_tool_result")


def validate(body: dict[str, Any], limits: RequestLimits) -> set[str]:
    """Refuses the first wrong type (400) or exceeded cap (413); returns the
    capabilities the content needs (``vision``, ``documents``). ``model``,
    ``max_tokens`` and ``stream`` are the parser's own, checked before this."""
    walk = Walk(limits)
    walk.check_counts(body)
    walk.required(body, "messages", "", list, "an array")
    for name in ("temperature", "top_p", "top_k"):
        walk.number(body, name, "")
    walk.strings(body, "stop_sequences", "")
    metadata = walk.mapping(body, "metadata", "")
    if metadata is not None:
        walk.string(metadata, "user_id", "metadata.")
    thinking = walk.mapping(body, "thinking", "")
    if thinking is not None:
        walk.string(thinking, "type", "thinking.")
    needs: set[str] = set()
    system = walk.optional(body, "system", "", (str, list), "a string or an array of content blocks")
    if isinstance(system, list):
        _blocks(walk, system, "system", needs)
    _tools(walk, body)
    _tool_choice(walk, body)
    servers = walk.array(body, "mcp_servers", "")
    for i, server in enumerate(servers or ()):
        walk.string(walk.object(server, f"mcp_servers[{i}]"), "name", f"mcp_servers[{i}].")
    for i, message in enumerate(body["messages"]):
        where = f"messages[{i}]"
        message = walk.object(message, where)
        walk.string(message, "role", f"{where}.", required=True)  # "system" inside messages is Claude Code's: passed on
        content = walk.required(message, "content", f"{where}.", (str, list), "a string or an array of content blocks")
        if isinstance(content, list):
            _blocks(walk, content, f"{where}.content", needs)
    return needs


def _blocks(walk: Walk, blocks: list[Any], where: str, needs: set[str]) -> None:
    walk.blocks(len(blocks))
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        block = walk.object(block, at)
        kind = walk.string(block, "type", f"{at}.", required=True)
        _block(walk, block, kind, f"{at}.", needs)


def _block(walk: Walk, block: dict[str, Any], kind: str | None, at: str, needs: set[str]) -> None:
    if kind == "text":
        walk.required(block, "text", at, str, "a string")
        walk.array(block, "citations", at)
    elif kind in _TOOL_CALLS:
        walk.string(block, "id", at)
        walk.string(block, "name", at)
    elif kind in _TOOL_RESULTS:
        walk.string(block, "tool_use_id", at)
        walk.boolean(block, "is_error", at)
        content = walk.optional(block, "content", at, (str, list), "a string or an array of content blocks")
        if isinstance(content, list):
            _blocks(walk, content, f"{at}content", needs)
    elif kind == "search_result":
        walk.string(block, "title", at)
        walk.string(block, "source", at)
        content = walk.array(block, "content", at)
        if content is not None:
            _blocks(walk, content, f"{at}content", needs)
    elif kind == "document":
        needs.add("documents")
        walk.string(block, "title", at)
        source = walk.mapping(block, "source", at)
        if source is not None:
            walk.string(source, "type", f"{at}source.")
            if source.get("type") == "text":
                walk.string(source, "data", f"{at}source.")
            elif source.get("type") == "content":
                content = walk.optional(source, "content", f"{at}source.", list, "an array of content blocks")
                if content is not None:
                    _blocks(walk, content, f"{at}source.content", needs)
    elif kind == "image":
        needs.add("vision")
        walk.mapping(block, "source", at)
    elif kind in ("thinking", "redacted_thinking"):
        walk.string(block, "thinking", at)
        walk.string(block, "signature", at)
        walk.string(block, "data", at)


def _tools(walk: Walk, body: dict[str, Any]) -> None:
    for i, tool in enumerate(walk.array(body, "tools", "") or ()):
        at = f"tools[{i}]."
        tool = walk.object(tool, f"tools[{i}]")
        walk.string(tool, "type", at)
        walk.string(tool, "name", at)
        walk.string(tool, "description", at)
        walk.mapping(tool, "input_schema", at)


def _tool_choice(walk: Walk, body: dict[str, Any]) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise wrong_type("tool_choice", "an object", choice)
    walk.string(choice, "type", "tool_choice.", required=True)
    walk.string(choice, "name", "tool_choice.")
