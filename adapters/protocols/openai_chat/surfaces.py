"""OpenAI Chat: the text of a request and of an answer, by surface, and where the
gateway adds its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import Inserted
from portcullis.adapters.protocols.text import (
    Handler,
    StreamText,
    TextVisitor,
    content_kind,
    each,
    members,
    visit_json_text,
    visit_leaves,
    visit_members,
    visit_schema,
    wrap_untrusted,
)
from portcullis.engine.conversation import Conversation, conversation_of, texts_of
from portcullis.engine.integrity.spotlight import Boundary

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


def visit_answer(document: dict[str, Any], visit: TextVisitor) -> None:
    """Visits each choice's text, refusal, reasoning (Chat's is unsigned) and tool-call
    arguments (function, custom and legacy function_call)."""
    for choice in document.get("choices") or []:
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


def stream_texts(event: Mapping[str, Any]) -> list[StreamText]:
    """The text a chunk adds, per choice: its content, refusal and each tool call's
    arguments are separate channels."""
    texts = []
    for choice in event.get("choices") or []:
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


def provider_run_block(event: Mapping[str, Any]) -> Any:
    """Chat answers carry no calls the provider ran itself."""
    return None


def stream_ends(event: Mapping[str, Any]) -> list[Any]:
    """The choices a chunk finishes: each closes the channels of its own index."""
    return [choice.get("index", 0) for choice in event.get("choices") or [] if isinstance(choice, dict) and choice.get("finish_reason") is not None]


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


_TEXT = frozenset({"text"})
_ROLES = {"user": "user", "assistant": "assistant", "tool": "tool", "function": "tool"}


def conversation(body: Mapping[str, Any]) -> Conversation:
    """The request as a conversation: system and developer messages are its system texts."""
    system: list[str] = []
    messages = []
    for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
        if not isinstance(message, dict):
            continue
        texts = texts_of(message.get("content"), _TEXT)
        if message.get("role") in ("system", "developer"):
            system.extend(texts)
        else:
            messages.append((_ROLES.get(message.get("role"), "user"), texts))
    effort = body.get("reasoning_effort")
    return conversation_of(system, messages, isinstance(effort, str) and effort != "none")
