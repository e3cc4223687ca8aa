"""The OpenAI Chat Completions ingress validator: every request field the gateway
reads, type-checked with the client's own path, and the request's size caps. Fields
the gateway does not read pass through unchecked: the provider judges them."""

from __future__ import annotations

from typing import Any

from portcullis.adapters.protocols.validation import RequestLimits, Walk, wrong_type


def validate(body: dict[str, Any], limits: RequestLimits) -> bool:
    """Refuses the first wrong type (400) or exceeded cap (413); returns whether the
    conversation carries images. ``model``, ``messages`` (present, an array, not empty),
    the output limits and ``stream`` are the parser's own, checked before this."""
    walk = Walk(limits)
    walk.check_counts(body)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        walk.number(body, name, "")
    walk.strings(body, "stop", "", single=True)
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        walk.string(body, name, "")
    walk.mapping(body, "metadata", "")
    options = walk.mapping(body, "stream_options", "")
    if options is not None:
        walk.boolean(options, "include_usage", "stream_options.")
    _response_format(walk, body)
    prediction = walk.mapping(body, "prediction", "")
    if prediction is not None:
        _content(walk, prediction, "prediction.")
    _tools(walk, body)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        walk.string(choice, "type", "tool_choice.")
        function = walk.mapping(choice, "function", "tool_choice.")
        if function is not None:
            walk.string(function, "name", "tool_choice.function.")
    elif choice is not None and not isinstance(choice, str):
        raise wrong_type("tool_choice", "a string or an object", choice)
    images = False
    for i, message in enumerate(body["messages"]):
        where = f"messages[{i}]."
        message = walk.object(message, f"messages[{i}]")
        walk.string(message, "role", where, required=True)
        for name in ("name", "tool_call_id", "refusal", "reasoning_content"):
            walk.string(message, name, where)
        images = _content(walk, message, where) or images
        for j, call in enumerate(walk.array(message, "tool_calls", where) or ()):
            _tool_call(walk, walk.object(call, f"{where}tool_calls[{j}]"), f"{where}tool_calls[{j}].")
        legacy = walk.mapping(message, "function_call", where)
        if legacy is not None:
            walk.string(legacy, "name", f"{where}function_call.")
            walk.json_text(legacy, "arguments", f"{where}function_call.")
    return images


def _content(walk: Walk, message: dict[str, Any], where: str) -> bool:
    """A message's content: null, a string or an array of typed parts."""
    content = walk.optional(message, "content", where, (str, list), "a string or an array of content parts")
    if not isinstance(content, list):
        return False
    walk.blocks(len(content))
    images = False
    for k, part in enumerate(content):
        at = f"{where}content[{k}]"
        part = walk.object(part, at)
        kind = walk.string(part, "type", f"{at}.", required=True)
        if kind in ("text", "refusal"):
            walk.required(part, kind, f"{at}.", str, "a string")
        elif kind == "image_url":
            images = True
            image = walk.optional(part, "image_url", f"{at}.", dict, "an object")
            if image is not None:
                walk.string(image, "url", f"{at}.image_url.")
    return images


def _tool_call(walk: Walk, call: dict[str, Any], where: str) -> None:
    walk.string(call, "id", where)
    walk.string(call, "type", where)
    function = walk.mapping(call, "function", where)
    if function is not None:
        walk.string(function, "name", f"{where}function.")
        walk.json_text(function, "arguments", f"{where}function.")
    custom = walk.mapping(call, "custom", where)
    if custom is not None:
        walk.string(custom, "name", f"{where}custom.")
        walk.string(custom, "input", f"{where}custom.")


def _tools(walk: Walk, body: dict[str, Any]) -> None:
    for i, tool in enumerate(walk.array(body, "tools", "") or ()):
        at = f"tools[{i}]."
        tool = walk.object(tool, f"tools[{i}]")
        walk.string(tool, "type", at)
        for member in ("function", "custom"):
            spec = walk.mapping(tool, member, at)
            if spec is not None:
                walk.string(spec, "name", f"{at}{member}.")
                walk.string(spec, "description", f"{at}{member}.")
        function = tool.get("function")
        if isinstance(function, dict):
            walk.mapping(function, "parameters", f"{at}function.")
    for i, function in enumerate(walk.array(body, "functions", "") or ()):
        at = f"functions[{i}]."
        function = walk.object(function, f"functions[{i}]")
        walk.string(function, "name", at)
        walk.string(function, "description", at)
        walk.mapping(function, "parameters", at)


def _response_format(walk: Walk, body: dict[str, Any]) -> None:
    response_format = walk.mapping(body, "response_format", "")
    if response_format is None:
        return
    walk.string(response_format, "type", "response_format.")
    schema = walk.mapping(response_format, "json_schema", "response_format.")
    if schema is not None:
        walk.string(schema, "name", "response_format.json_schema.")
        walk.string(schema, "description", "response_format.json_schema.")
        walk.mapping(schema, "schema", "response_format.json_schema.")
