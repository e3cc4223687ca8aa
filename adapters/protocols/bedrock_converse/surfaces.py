"""Bedrock Converse: the text of a request and of an answer, by surface, and where the
gateway adds its own.

Content blocks are unions (``{"text": ...}``, ``{"toolUse": {...}}``); the validator
has refused every kind this module does not know, so each block is one of those below."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import Inserted
from portcullis.adapters.protocols.text import (
    ALL_CHANNELS,
    PROVIDER_RUN,
    Handler,
    StreamText,
    TextVisitor,
    each,
    members,
    read_strings,
    visit_leaves,
    visit_members,
    visit_schema,
)
from portcullis.engine.conversation import Conversation, asks_reasoning, conversation_of, texts_of
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pii.policy import SIGNED

SERVER_TOOL_USE = "server_tool_use"  # a toolUse the provider ran itself
_OPAQUE = {"image": "image", "video": "video", "audio": "audio"}


def visit_prompt(body: dict[str, Any], visit: TextVisitor) -> list[str]:
    """Visits every string of the request the model will read, in the order it reads
    them (tools first), so placeholders number in prompt order. Returns the kinds of
    content that cannot be inspected (images, video, audio, binary documents)."""
    opaque: list[str] = []

    def messages(value: Any) -> Any:
        for message in value if isinstance(value, list) else ():
            if isinstance(message, dict):
                surface = "assistant" if message.get("role") == "assistant" else "user"
                visit_members(message, {"content": lambda v, s=surface: _blocks(v, s, visit, opaque)}, visit)
        return value

    leaves = lambda surface: lambda value: visit_leaves(value, surface, visit)  # noqa: E731
    handlers: dict[str, Handler] = {
        "toolConfig": members({"tools": each(lambda tool: _tool(tool, visit))}, visit),
        "system": lambda v: _blocks(v, "system", visit, opaque),
        "messages": messages,
        "promptVariables": lambda v: _each_value(v, members({"text": leaves("user")}, visit)),
        "inferenceConfig": members({"stopSequences": leaves("text")}, visit),
    }
    visit_members(body, handlers, visit)
    return opaque


def _each_value(value: Any, handler: Handler) -> Any:
    if isinstance(value, dict):
        for key in value:
            value[key] = handler(value[key])
    return value


def _tool(tool: Any, visit: TextVisitor) -> Any:
    spec = {
        "description": lambda v: visit("tool_descriptions", v) if isinstance(v, str) else v,
        "inputSchema": members({"json": lambda v: visit_schema(v, visit)}, visit),
    }
    return members({"toolSpec": members(spec, visit)}, visit)(tool)


def _blocks(value: Any, surface: str, visit: TextVisitor, opaque: list[str]) -> Any:
    for i, block in enumerate(value if isinstance(value, list) else ()):
        value[i] = _block(block, surface, visit, opaque)
    return value


def _block(block: Any, surface: str, visit: TextVisitor, opaque: list[str]) -> Any:
    """One content block (a union of one member), its strings visited in place."""
    if not isinstance(block, dict) or len(block) != 1:
        read_strings(block, visit)
        return block
    ((kind, payload),) = block.items()
    leaves = lambda where: lambda value: visit_leaves(value, where, visit)  # noqa: E731
    handlers: dict[str, Handler]
    if kind == "text":
        handlers = {"text": leaves(surface)}
    elif kind in _OPAQUE:
        opaque.append(_OPAQUE[kind])  # binary data: not read
        return block
    elif kind == "document":
        return {kind: _document(payload, surface, visit, opaque)}
    elif kind == "toolUse":
        tool_surface = PROVIDER_RUN if isinstance(payload, dict) and payload.get("type") == SERVER_TOOL_USE else "tool_arguments"
        handlers = {"toolUse": members({"input": leaves(tool_surface)}, visit)}
    elif kind == "toolResult":
        handlers = {"toolResult": members({"content": lambda v: _result(v, visit, opaque)}, visit)}
    elif kind == "guardContent":
        return {kind: _guard(payload, surface, visit, opaque)}
    elif kind == "reasoningContent":
        # The provider checks the signature: the reasoning is read, never changed; the
        # signature and redacted (encrypted) reasoning are the provider's own, unread.
        reasoning = payload.get("reasoningText") if isinstance(payload, dict) else None
        if isinstance(reasoning, dict):
            read_strings(reasoning.get("text"), visit, SIGNED)
        return block
    elif kind == "citationsContent":
        citation = {"title": leaves(surface), "source": leaves(surface), "sourceContent": leaves(surface)}
        handlers = {"citationsContent": members({"content": leaves(surface), "citations": each(members(citation, visit))}, visit)}
    elif kind == "searchResult":
        handlers = {"searchResult": members({"title": leaves("tool_results"), "source": leaves("tool_results"), "content": leaves("tool_results")}, visit)}
    else:
        handlers = {}
    visit_members(block, handlers, visit)
    return block


def _result(value: Any, visit: TextVisitor, opaque: list[str]) -> Any:
    for i, item in enumerate(value if isinstance(value, list) else ()):
        if isinstance(item, dict) and "json" in item and len(item) == 1:
            item["json"] = visit_leaves(item["json"], "tool_results", visit)
        else:
            value[i] = _block(item, "tool_results", visit, opaque)
    return value


def _document(document: Any, surface: str, visit: TextVisitor, opaque: list[str]) -> Any:
    if not isinstance(document, dict):
        return document
    source = document.get("source")
    kind = next(iter(source), None) if isinstance(source, dict) and len(source) == 1 else None
    # Its name (of a restricted alphabet a mask would break) is read as ``other``, never rewritten.
    handlers: dict[str, Handler] = {
        "context": lambda v: visit_leaves(v, surface, visit),
        "source": lambda v: v,  # below: text is read and changed, binary data is opaque
    }
    visit_members(document, handlers, visit)
    if kind == "text":
        source["text"] = visit_leaves(source["text"], surface, visit)
    elif kind == "content":
        source["content"] = visit_leaves(source["content"], surface, visit)
    else:
        opaque.append("document")
    return document


def _guard(guarded: Any, surface: str, visit: TextVisitor, opaque: list[str]) -> Any:
    if isinstance(guarded, dict) and "image" in guarded:
        opaque.append("image")
        return guarded
    text = {"text": members({"text": lambda v: visit_leaves(v, surface, visit)}, visit)}
    return members(text, visit)(guarded)


def visit_answer(document: dict[str, Any], visit: TextVisitor) -> None:
    """Visits the text and tool input of a Converse response; its reasoning is read
    (surface ``signed``) and never changed."""
    message = (document.get("output") or {}).get("message") if isinstance(document.get("output"), dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            block["text"] = visit("text", block["text"])
        elif isinstance(block.get("toolUse"), dict) and "input" in block["toolUse"]:
            call = block["toolUse"]
            # The client runs toolUse; a server tool already ran at the provider.
            call["input"] = visit_leaves(call["input"], PROVIDER_RUN if call.get("type") == SERVER_TOOL_USE else "tool_arguments", visit)
        elif isinstance(block.get("reasoningContent"), dict):
            reasoning = block["reasoningContent"].get("reasoningText")
            if isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
                visit(SIGNED, reasoning["text"])
        elif isinstance(block.get("citationsContent"), dict):
            for item in block["citationsContent"].get("content") or ():
                if isinstance(item, dict) and isinstance(item.get("text"), str):
                    item["text"] = visit("text", item["text"])


def stream_texts(event: Mapping[str, Any]) -> list[StreamText]:
    """The text a ``contentBlockDelta`` adds to its block: answer text, a piece of a
    tool call's input (JSON source), or reasoning (``signed``)."""
    payload = event.get("contentBlockDelta")
    delta = payload.get("delta") if isinstance(payload, dict) else None
    if not isinstance(delta, dict):
        return []
    channel = payload.get("contentBlockIndex")
    if isinstance(delta.get("text"), str):
        return [StreamText(channel, delta, "text")]
    tool = delta.get("toolUse")
    if isinstance(tool, dict) and isinstance(tool.get("input"), str):
        return [StreamText(channel, tool, "input", json=True, arguments=True)]
    reasoning = delta.get("reasoningContent")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
        return [StreamText(channel, reasoning, "text", signed=True)]
    return []


def provider_run_block(event: Mapping[str, Any]) -> Any:
    """The index of a content block this event opens for a call the provider runs
    itself (a server tool), else None."""
    payload = event.get("contentBlockStart")
    start = payload.get("start") if isinstance(payload, dict) else None
    tool = start.get("toolUse") if isinstance(start, dict) else None
    index = payload.get("contentBlockIndex") if isinstance(payload, dict) else None
    return index if isinstance(index, int) and isinstance(tool, dict) and tool.get("type") == SERVER_TOOL_USE else None


def stream_ends(event: Mapping[str, Any]) -> list[Any]:
    """The channels an event closes (``ALL_CHANNELS``: every one)."""
    stop = event.get("contentBlockStop")
    if isinstance(stop, dict):
        return [stop.get("contentBlockIndex")]
    return [ALL_CHANNELS] if "messageStop" in event else []


def insert_system_prompt(body: dict[str, Any], text: str) -> None:
    """The policy prompt as the first system block, its own block, so the client's
    blocks (and their cache points) follow it unchanged."""
    block = Inserted(text=text)
    system = body.get("system")
    if isinstance(system, list):
        system.insert(0, block)
    else:
        body["system"] = [block]


def leading_instructions(body: Mapping[str, Any]) -> str | None:
    """The text of the first system block: where a policy prompt would be."""
    system = body.get("system")
    first = system[0] if isinstance(system, list) and system else None
    text = first.get("text") if isinstance(first, dict) else None
    return text if isinstance(text, str) else None


def declared_tools(body: Mapping[str, Any]) -> list[str]:
    """The names of the tools a request offers the model; a system tool, which the
    provider runs itself, is ``server:<name>``: policy can allow or refuse it, but
    never judge its calls."""
    config = body.get("toolConfig")
    names = []
    for tool in config.get("tools") or () if isinstance(config, dict) else ():
        for kind, prefix in (("toolSpec", ""), ("systemTool", "server:")):
            spec = tool.get(kind) if isinstance(tool, dict) else None
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                names.append(prefix + spec["name"])
    return names


def spotlight(body: dict[str, Any], boundary: Boundary, sources: frozenset[str]) -> int:
    """Wraps tool results and documents in untrusted boundaries; returns how many.
    A tool result is wrapped inside its own content; a document gets boundary text
    blocks around it in its message."""
    names: dict[Any, Any] = {}  # toolUseId -> tool name, from the assistant turns
    wrapped = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        if message.get("role") == "assistant":
            calls = [b["toolUse"] for b in content if isinstance(b, dict) and isinstance(b.get("toolUse"), dict)]
            names.update({call.get("toolUseId"): call.get("name") for call in calls})
            continue
        out: list[Any] = []
        for block in content:
            result = block.get("toolResult") if isinstance(block, dict) else None
            if isinstance(result, dict) and "tool_results" in sources and isinstance(result.get("content"), list):
                call = result.get("toolUseId")
                result["content"] = _between(result["content"], boundary, "tool_result", tool=names.get(call), id=call)
                wrapped += 1
            elif isinstance(block, dict) and ("document" in block or "searchResult" in block) and "documents" in sources:
                kind = "document" if "document" in block else "search_result"
                inner = block.get("document") or block.get("searchResult")
                title = inner.get("name" if kind == "document" else "title") if isinstance(inner, dict) else None
                out += _between([block], boundary, kind, title=title if isinstance(title, str) else None)
                wrapped += 1
                continue
            out.append(block)
        message["content"] = out
    return wrapped


def _between(blocks: list[Any], boundary: Boundary, source: str, **attributes: Any) -> list[Any]:
    """Blocks between two boundary text blocks; their text cleaned of the boundary."""
    visit_leaves(blocks, "tool_results", lambda _, text: boundary.clean(text))
    named = {key: value if isinstance(value, str) else None for key, value in attributes.items()}
    return [{"text": boundary.opening(source, **named)}, *blocks, {"text": boundary.closing()}]


_TEXT = frozenset({"text"})


def conversation(body: Mapping[str, Any]) -> Conversation:
    """The request as a conversation; a user message of tool results only is a tool turn."""
    system = list(texts_of(body.get("system"), _TEXT)) if isinstance(body.get("system"), list) else []
    messages = []
    for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
        if isinstance(message, dict):
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            tool_turn = bool(blocks) and all(isinstance(b, dict) and "toolResult" in b for b in blocks)
            role = "tool" if tool_turn else ("assistant" if message.get("role") == "assistant" else "user")
            messages.append((role, texts_of(blocks, _TEXT)))
    extra = body.get("additionalModelRequestFields")
    extra = extra if isinstance(extra, dict) else {}
    reasoning = asks_reasoning(extra.get("thinking"), "type", ("disabled", None)) or isinstance(extra.get("reasoning_config"), dict)
    return conversation_of(system, messages, reasoning)
