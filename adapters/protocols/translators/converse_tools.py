"""Tool definitions and tool choice between Anthropic Messages and Bedrock Converse,
both ways. Only custom tools convert: Anthropic's server tools run at Anthropic and
Converse's system tools at Bedrock. Converse says "no tool may be called" by sending
no tools, so Messages' ``none`` becomes no ``toolConfig``; a turn limited to one call
(``disable_parallel_tool_use``) has no Converse form and is refused."""

from __future__ import annotations

from typing import Any

from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.translators.converse_blocks import CONVERSE, MESSAGES, cache_marker, cache_point, string_member, union_member
from portcullis.engine.errors import excerpt

_MAX_TOOL_NAME = 64  # Converse's limit; Messages allows 128
_TOOL_MEMBERS = {"type", "name", "description", "input_schema", "cache_control", "strict"}


def to_converse_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools: expected an array")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
            raise invalid(f"{at}: only custom tools can be converted for {CONVERSE} (server tools run at Anthropic)")
        unknown = sorted(set(tool) - _TOOL_MEMBERS)
        if unknown:
            raise invalid(f"{at}.{unknown[0]}: cannot be converted for {CONVERSE}")
        name = string_member(tool, "name", at)
        if len(name) > _MAX_TOOL_NAME:
            raise invalid(f"{at}.name: {CONVERSE} allows tool names of at most {_MAX_TOOL_NAME} characters")
        schema = tool.get("input_schema") or {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise invalid(f"{at}.input_schema: expected an object")
        spec: dict[str, Any] = {"name": name, "inputSchema": {"json": schema}}
        if tool.get("description"):
            spec["description"] = string_member(tool, "description", at)
        if tool.get("strict") is not None:
            spec["strict"] = bool(tool["strict"])
        out.append({"toolSpec": spec})
        if tool.get("cache_control") is not None:
            out.append(cache_point(tool["cache_control"], f"{at}.cache_control"))
    return out


def to_converse_tool_choice(choice: Any) -> dict[str, Any] | None:
    """Converse's toolChoice; ``None`` for ``none``, which Converse says by sending no tools."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
        raise invalid(f"tool_choice.disable_parallel_tool_use: {CONVERSE} cannot limit a turn to one tool call")
    if kind in ("auto", "any"):
        return {kind: {}}
    if kind == "tool":
        return {"tool": {"name": string_member(choice, "name", "tool_choice")}}
    if kind == "none":
        return None
    raise invalid(f"tool_choice.type: {excerpt(kind)} cannot be converted for {CONVERSE}")


def to_messages_tools(config: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``toolConfig`` as Messages ``tools`` and ``tool_choice``."""
    if not isinstance(config, dict):
        raise invalid("toolConfig: expected an object")
    unknown = sorted(set(config) - {"tools", "toolChoice"})
    if unknown:
        raise invalid(f"toolConfig.{unknown[0]}: cannot be converted for {MESSAGES}")
    tools: list[dict[str, Any]] = []
    entries = config.get("tools")
    if not isinstance(entries, list):
        raise invalid("toolConfig.tools: expected an array")
    for i, entry in enumerate(entries):
        kind, value, at = union_member(entry, f"toolConfig.tools[{i}]")
        if kind == "cachePoint":
            if not tools:
                raise invalid(f"{at}.cachePoint: must follow a tool")
            tools[-1]["cache_control"] = cache_marker(value, at)
            continue
        if kind != "toolSpec" or not isinstance(value, dict):
            raise invalid(f"{at}.{kind}: cannot be converted for {MESSAGES}")
        schema = value.get("inputSchema")
        if not isinstance(schema, dict) or not isinstance(schema.get("json"), dict):
            raise invalid(f"{at}.toolSpec.inputSchema.json: expected an object")
        tool: dict[str, Any] = {"name": string_member(value, "name", f"{at}.toolSpec"), "input_schema": schema["json"]}
        if value.get("description"):
            tool["description"] = string_member(value, "description", f"{at}.toolSpec")
        if value.get("strict") is not None:
            tool["strict"] = bool(value["strict"])
        tools.append(tool)
    choice = config.get("toolChoice")
    if choice is None:
        return tools, None
    kind, value, at = union_member(choice, "toolConfig.toolChoice")
    if kind in ("auto", "any"):
        return tools, {"type": kind}
    if kind == "tool" and isinstance(value, dict):
        return tools, {"type": "tool", "name": string_member(value, "name", f"{at}.tool")}
    raise invalid(f"{at}.{kind}: cannot be converted for {MESSAGES}")
