"""The OpenAI Responses ingress validator: every request field the gateway reads,
type-checked with the client's own path, and the request's size caps. Fields the
gateway does not read pass through unchecked: the provider judges them."""

from __future__ import annotations

from typing import Any

from portcullis.adapters.protocols.validation import RequestLimits, Walk, too_many, wrong_type

_TEXT_PARTS = {"input_text": "text", "output_text": "text", "summary_text": "text", "reasoning_text": "text", "refusal": "refusal"}


def validate(body: dict[str, Any], limits: RequestLimits) -> bool:
    """Refuses the first wrong type (400) or exceeded cap (413); returns whether the
    input carries images. ``model``, ``input`` (present), ``max_output_tokens`` and
    ``stream`` are the parser's own, checked before this."""
    walk = Walk(limits)
    walk.check_counts(body)
    items = body["input"]
    if not isinstance(items, (str, list)):
        raise wrong_type("input", "a string or an array of input items", items)
    if isinstance(items, list) and len(items) > limits.max_messages:
        raise too_many("input items", limits.max_messages, "too_many_messages")
    for name in ("temperature", "top_p"):
        walk.number(body, name, "")
    for name in ("instructions", "user", "safety_identifier", "prompt_cache_key", "service_tier", "truncation"):
        walk.string(body, name, "")
    for name in ("store", "parallel_tool_calls", "background"):
        walk.boolean(body, name, "")
    walk.mapping(body, "metadata", "")
    walk.strings(body, "include", "")
    reasoning = walk.mapping(body, "reasoning", "")
    if reasoning is not None:
        for name in ("effort", "summary"):
            walk.string(reasoning, name, "reasoning.")
    _text(walk, body)
    _tools(walk, walk.array(body, "tools", "") or (), "tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        walk.string(choice, "type", "tool_choice.")
        walk.string(choice, "name", "tool_choice.")
    elif choice is not None and not isinstance(choice, str):
        raise wrong_type("tool_choice", "a string or an object", choice)
    images = False
    for i, item in enumerate(items if isinstance(items, list) else ()):
        images = _item(walk, walk.object(item, f"input[{i}]"), f"input[{i}].") or images
    return images


def _item(walk: Walk, item: dict[str, Any], where: str) -> bool:
    """One input item; a message is one without a type, or of type ``message``."""
    kind = walk.string(item, "type", where)
    walk.string(item, "id", where)
    if kind in (None, "message"):
        walk.string(item, "role", where, required=True)
        return _content(walk, item, "content", where)
    walk.string(item, "call_id", where)
    if kind == "function_call":
        walk.string(item, "name", where)
        walk.json_text(item, "arguments", where)
    elif kind == "custom_tool_call":
        walk.string(item, "name", where)
        walk.string(item, "input", where)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        return _content(walk, item, "output", where)
    elif kind == "reasoning":
        walk.optional(item, "encrypted_content", where, str, "a string")
        for j, part in enumerate(walk.array(item, "summary", where) or ()):
            part = walk.object(part, f"{where}summary[{j}]")
            walk.string(part, "type", f"{where}summary[{j}].")
            walk.string(part, "text", f"{where}summary[{j}].")
    return False


def _content(walk: Walk, container: dict[str, Any], name: str, where: str) -> bool:
    """A message's content or a call's output: a string or an array of typed parts."""
    content = walk.optional(container, name, where, (str, list), "a string or an array of content parts")
    if not isinstance(content, list):
        return False
    walk.blocks(len(content))
    images = False
    for k, part in enumerate(content):
        at = f"{where}{name}[{k}]"
        part = walk.object(part, at)
        kind = walk.string(part, "type", f"{at}.", required=True)
        if kind in _TEXT_PARTS:
            walk.required(part, _TEXT_PARTS[kind], f"{at}.", str, "a string")
        elif kind == "input_image":
            images = True
            for member in ("image_url", "file_id", "detail"):
                walk.string(part, member, f"{at}.")
        elif kind == "input_file":
            for member in ("file_data", "file_url", "file_id", "filename"):
                walk.string(part, member, f"{at}.")
    return images


def _tools(walk: Walk, tools: Any, where: str) -> None:
    for i, tool in enumerate(tools):
        at = f"{where}[{i}]."
        tool = walk.object(tool, f"{where}[{i}]")
        walk.string(tool, "type", at)
        walk.string(tool, "name", at)
        walk.string(tool, "description", at)
        walk.mapping(tool, "parameters", at)
        walk.mapping(tool, "format", at)
        if tool.get("type") == "namespace":
            _tools(walk, walk.array(tool, "tools", at) or (), f"{at}tools")


def _text(walk: Walk, body: dict[str, Any]) -> None:
    text = walk.mapping(body, "text", "")
    response_format = walk.mapping(text, "format", "text.") if text is not None else None
    if response_format is None:
        return
    for name in ("type", "name", "description"):
        walk.string(response_format, name, "text.format.")
    walk.mapping(response_format, "schema", "text.format.")
