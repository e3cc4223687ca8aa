"""A Responses request read for a foreign provider, as both translators that serve a
Responses client need it: the top-level members sorted into converted, dropped and
refused; ``instructions`` and ``input`` as a flat list of turns (instructions, user
content, assistant text, tool calls, tool results) with every call paired by its
``call_id``; tools and ``tool_choice`` in a neutral form.

Dropped because they change cost or storage, not meaning: ``store``, ``include``,
``metadata`` (kept with a stored response, never read by the model), ``service_tier``,
``prompt_cache_key`` and the other prompt-cache hints, ``stream_options``
(obfuscation padding). Reasoning items without ``encrypted_content`` are dropped: their
summaries and text describe another model's reasoning, which no foreign model can
continue (OpenAI itself reads only the encrypted form). A reasoning item *with*
``encrypted_content`` is refused: it is OpenAI's alone, and dropping it would lose the
state the client expects to carry on; the gateway then tries the next target."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.translators.responses_events import CUSTOM_SUFFIX, check_function_name, custom_description, custom_parameters
from portcullis.engine.errors import excerpt

# The members both foreign providers' translators convert (what each does with them is its own).
CONVERTED = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "text",
    "reasoning",
    "user",
    "safety_identifier",
}
DROPPED = {"store", "include", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "stream_options"}
# Members accepted only at the value that asks for nothing.
_NO_OP: dict[str, Any] = {"truncation": "disabled", "background": False, "top_logprobs": 0}


@dataclass(frozen=True)
class Instruction:
    text: str
    where: str


@dataclass(frozen=True)
class UserContent:
    parts: list[dict[str, Any]]  # input_text / input_image / input_file parts, as the client sent them
    where: str


@dataclass(frozen=True)
class AssistantText:
    text: str


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str  # a custom tool's carries CUSTOM_SUFFIX
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Result:
    call_id: str
    output: str | list[dict[str, Any]]
    where: str


Turn = Instruction | UserContent | AssistantText | Call | Result


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool | None = None


def check_members(body: Mapping[str, Any], target: str) -> None:
    for name, value in body.items():
        if name in CONVERTED or name in DROPPED or value is None:
            continue
        if name in _NO_OP and value == _NO_OP[name]:
            continue
        raise invalid(f"{name}: cannot be converted for {target}")


def turns(body: Mapping[str, Any], target: str) -> list[Turn]:
    out: list[Turn] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions: expected a string")
        out.append(Instruction(instructions, "instructions"))
    items = body.get("input")
    if isinstance(items, str):
        return [*out, UserContent([{"type": "input_text", "text": items}], "input")]
    if not isinstance(items, list):
        raise invalid("input: expected a string or an array of items")
    calls: set[str] = set()
    for i, item in enumerate(items):
        out.extend(_item(item, f"input[{i}]", calls, target))
    return out


def _item(item: Any, where: str, calls: set[str], target: str) -> list[Turn]:
    if not isinstance(item, dict):
        raise invalid(f"{where}: expected an object")
    kind = item.get("type", "message")
    if kind == "message":
        return _message(item, where, target)
    if kind in ("function_call", "custom_tool_call"):
        if item.get("namespace"):
            raise invalid(f"{where}.namespace: namespaced tools cannot be converted for {target}")
        call_id = _string(item, "call_id", where)
        if kind == "function_call":
            name = check_function_name(item.get("name"), where)
            try:
                arguments = json.loads(_string(item, "arguments", where) or "{}")
            except ValueError:
                raise invalid(f"{where}.arguments: not valid JSON") from None
            if not isinstance(arguments, dict):
                raise invalid(f"{where}.arguments: expected a JSON object")
        else:
            name = _string(item, "name", where) + CUSTOM_SUFFIX
            arguments = {"input": _string(item, "input", where)}
        calls.add(call_id)
        return [Call(call_id, name, arguments)]
    if kind in ("function_call_output", "custom_tool_call_output"):
        call_id = _string(item, "call_id", where)
        if call_id not in calls:
            raise invalid(f"{where}.call_id: no earlier call in input has this call_id")
        output = item.get("output")
        if not isinstance(output, str | list):
            raise invalid(f"{where}.output: expected a string or an array of content parts")
        return [Result(call_id, output, where)]
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise invalid(f"{where}.encrypted_content: reasoning encrypted by OpenAI cannot be read by {target}")
        return []
    raise invalid(f"{where}.type: {excerpt(kind)} items cannot be converted for {target}")


def _message(item: Mapping[str, Any], where: str, target: str) -> list[Turn]:
    role, content = item.get("role"), item.get("content")
    if isinstance(content, str):
        content = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or an array of content parts")
    if role in ("system", "developer"):
        return [Instruction("".join(text_parts(content, f"{where}.content")), where)]
    if role == "user":
        return [UserContent(content, f"{where}.content")]
    if role == "assistant":
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            key = "refusal" if kind == "refusal" else "text"
            if kind not in ("output_text", "input_text", "refusal") or not isinstance(part.get(key), str):
                raise invalid(f"{where}.content[{j}]: part type {excerpt(kind)} cannot be converted for {target}")
            texts.append(part[key])
        return [AssistantText("".join(texts))]
    raise invalid(f"{where}.role: {excerpt(role)} cannot be converted for {target}")


def text_parts(content: list[Any], where: str) -> list[str]:
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise invalid(f"{where}[{j}]: only text parts can be converted here")
        texts.append(part["text"])
    return texts


def _string(item: Mapping[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}: expected a string")
    return value


def data_url(url: str, where: str) -> tuple[str, str]:
    """``data:<media type>;base64,<data>`` as (media type, data)."""
    header, _, data = url.partition(",")
    if not header.startswith("data:") or not header.endswith(";base64") or not data:
        raise invalid(f"{where}: expected a base64 data URL")
    return header.removeprefix("data:").removesuffix(";base64"), data


def tools(body: Mapping[str, Any], target: str) -> list[Tool]:
    listed = body.get("tools") or []
    if not isinstance(listed, list):
        raise invalid("tools: expected an array")
    out = []
    for i, tool in enumerate(listed):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in ("function", "custom"):
            # Built-in tools run at OpenAI; namespaces and tool search load tools there.
            raise invalid(f"{where}: tool type {excerpt(kind)} cannot be converted for {target}")
        if tool.get("defer_loading"):
            raise invalid(f"{where}.defer_loading: deferred tools cannot be converted for {target}")
        if kind == "function":
            name = check_function_name(tool.get("name"), where)
            parameters = tool.get("parameters") or {"type": "object", "properties": {}}
            strict = tool.get("strict")
            out.append(Tool(name, tool.get("description") or None, parameters, strict if isinstance(strict, bool) else None))
        else:
            name = _string(tool, "name", where)
            out.append(Tool(name + CUSTOM_SUFFIX, custom_description(tool, where) or None, custom_parameters(None)))
    return out


def tool_choice(body: Mapping[str, Any], target: str) -> str | tuple[str, str] | None:
    """``auto``, ``none``, ``required``, ``("tool", name)`` or ``None`` (not set)."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        return ("tool", choice["name"] + (CUSTOM_SUFFIX if kind == "custom" else ""))
    raise invalid(f"tool_choice: {excerpt(kind or choice)} cannot be converted for {target}")


def text_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``text.format`` unless it asks for plain text; ``text.verbosity`` is a style hint
    that the translators drop."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("text: expected an object")
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        raise invalid(f"text.{sorted(unknown)[0]}: cannot be converted")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format: expected an object")
    return fmt
