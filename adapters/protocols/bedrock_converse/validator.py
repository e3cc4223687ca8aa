"""The Bedrock Converse ingress validator: every member the provider reads as content,
type-checked with the client's own path (``messages[0].content[1].text``), and the
request's size caps.

Stricter than the Messages validator: content blocks are unions, and a block this
gateway cannot inspect (a member it does not know, a ``system``-role turn that adds
tools, content held in S3) is refused, since the PII and integrity guards must see
every string the provider will read. Top-level members it does not know pass through
(clients add new ones); ``additionalModelRequestFields`` is an object passed as is."""

from __future__ import annotations

from typing import Any

from portcullis.adapters.protocols.aws_errors import NO_TRACE
from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.validation import RequestLimits, Walk, too_many, wrong_type
from portcullis.engine.errors import printable

ROLES = ("user", "assistant")
_MEDIA = ("image", "video", "audio")  # binary sources: bytes (S3 is refused)


def validate(body: dict[str, Any], limits: RequestLimits) -> set[str]:
    """Refuses the first wrong type or uninspectable block (400) or exceeded cap (413);
    returns the capabilities the content needs (``vision``, ``documents``). The model,
    the stream flag and ``inferenceConfig.maxTokens`` are the parser's own."""
    walk = Walk(limits)
    walk.check_counts(body)
    messages = walk.required(body, "messages", "", list, "an array")
    if not messages:
        raise invalid("messages: must contain at least one message")
    _inference_config(walk, body)
    needs: set[str] = set()
    system = walk.array(body, "system", "")
    for i, block in enumerate(system or ()):
        _system_block(walk, block, f"system[{i}]", needs)
    _tool_config(walk, body)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        message = walk.object(message, where)
        role = walk.string(message, "role", f"{where}.", required=True)
        if role not in ROLES:
            raise invalid(f"{where}.role: expected 'user' or 'assistant'")  # system turns add tools the gateway never declared
        content = walk.required(message, "content", f"{where}.", list, "an array of content blocks")
        _blocks(walk, content, f"{where}.content", needs)
    walk.mapping(body, "additionalModelRequestFields", "")
    walk.strings(body, "additionalModelResponseFieldPaths", "")
    _string_map(walk, body, "requestMetadata")
    variables = walk.mapping(body, "promptVariables", "")
    for name, value in (variables or {}).items():
        walk.string(walk.object(value, f"promptVariables.{printable(name)}"), "text", f"promptVariables.{printable(name)}.")
    guardrail = walk.mapping(body, "guardrailConfig", "")
    for name in ("guardrailIdentifier", "guardrailVersion", "trace", "streamProcessingMode"):
        walk.string(guardrail or {}, name, "guardrailConfig.")
    if (guardrail or {}).get("trace", "disabled") != "disabled":
        raise invalid(NO_TRACE.format(where="guardrailConfig.trace"))
    return needs



def union(walk: Walk, value: Any, where: str, known: tuple[str, ...], what: str) -> tuple[str, Any]:
    """A union value (an object with exactly one member): its member's name and value;
    a member this gateway does not know is refused, naming it."""
    value = walk.object(value, where)
    if len(value) != 1:
        raise invalid(f"{where}: expected exactly one member (a {what}), got {len(value)}")
    ((kind, payload),) = value.items()
    if kind not in known:
        raise invalid(f"{where}: unsupported {what} '{printable(kind)}'")
    return kind, payload


_BLOCKS = ("text", "image", "document", "video", "audio", "toolUse", "toolResult", "guardContent", "cachePoint")
_BLOCKS += ("reasoningContent", "citationsContent", "searchResult")
_RESULT_BLOCKS = ("text", "json", "image", "document", "video", "searchResult")
_SYSTEM_BLOCKS = ("text", "guardContent", "cachePoint")


def _blocks(walk: Walk, blocks: list[Any], where: str, needs: set[str]) -> None:
    walk.blocks(len(blocks))
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind, payload = union(walk, block, at, _BLOCKS, "content block")
        _block(walk, kind, payload, f"{at}.{kind}", needs)


def _block(walk: Walk, kind: str, payload: Any, at: str, needs: set[str]) -> None:
    if kind == "text":
        _text(payload, at)
    elif kind in _MEDIA:
        _media(walk, kind, payload, at, needs)
    elif kind == "document":
        _document(walk, payload, at, needs)
    elif kind == "toolUse":
        block = walk.object(payload, at)
        walk.string(block, "toolUseId", f"{at}.", required=True)
        walk.string(block, "name", f"{at}.", required=True)
        walk.string(block, "type", f"{at}.")
        if "input" not in block:
            raise invalid(f"{at}.input: field required")
    elif kind == "toolResult":
        block = walk.object(payload, at)
        walk.string(block, "toolUseId", f"{at}.", required=True)
        walk.string(block, "status", f"{at}.")
        content = walk.required(block, "content", f"{at}.", list, "an array of content blocks")
        walk.blocks(len(content))
        for i, item in enumerate(content):
            inner, value = union(walk, item, f"{at}.content[{i}]", _RESULT_BLOCKS, "tool result block")
            if inner != "json":  # a JSON result is any document: its leaves are read as they are
                _block(walk, inner, value, f"{at}.content[{i}].{inner}", needs)
    elif kind == "guardContent":
        _guard_content(walk, payload, at, needs)
    elif kind == "cachePoint":
        walk.string(walk.object(payload, at), "type", f"{at}.", required=True)
    elif kind == "reasoningContent":
        _reasoning(walk, payload, at)
    elif kind == "citationsContent":
        block = walk.object(payload, at)
        for i, item in enumerate(walk.array(block, "content", f"{at}.") or ()):
            _, text = union(walk, item, f"{at}.content[{i}]", ("text",), "generated content")
            _text(text, f"{at}.content[{i}].text")
        for i, citation in enumerate(walk.array(block, "citations", f"{at}.") or ()):
            _citation(walk, citation, f"{at}.citations[{i}]")
    elif kind == "searchResult":
        block = walk.object(payload, at)
        walk.string(block, "source", f"{at}.", required=True)
        walk.string(block, "title", f"{at}.", required=True)
        for i, item in enumerate(walk.required(block, "content", f"{at}.", list, "an array")):
            walk.string(walk.object(item, f"{at}.content[{i}]"), "text", f"{at}.content[{i}].", required=True)


def _text(value: Any, at: str) -> None:
    if not isinstance(value, str):
        raise wrong_type(at, "a string", value)


def _source(walk: Walk, block: dict[str, Any], at: str, known: tuple[str, ...]) -> tuple[str, Any]:
    """A content source; one in S3 is refused: the gateway cannot read what it would judge."""
    source = walk.required(block, "source", f"{at}.", dict, "an object")
    kind, value = union(walk, source, f"{at}.source", (*known, "s3Location"), "source")
    if kind == "s3Location":
        raise invalid(f"{at}.source.s3Location: content in S3 cannot be inspected by this gateway; send it inline")
    return kind, value


def _media(walk: Walk, kind: str, payload: Any, at: str, needs: set[str]) -> None:
    block = walk.object(payload, at)
    walk.string(block, "format", f"{at}.", required=True)
    _, data = _source(walk, block, at, ("bytes",))
    _text(data, f"{at}.source.bytes")  # base64 on the JSON wire
    if kind == "image":
        needs.add("vision")


def _document(walk: Walk, payload: Any, at: str, needs: set[str]) -> None:
    needs.add("documents")
    block = walk.object(payload, at)
    walk.string(block, "name", f"{at}.", required=True)
    walk.string(block, "format", f"{at}.")
    walk.string(block, "context", f"{at}.")
    citations = walk.mapping(block, "citations", f"{at}.")
    if citations is not None:
        walk.boolean(citations, "enabled", f"{at}.citations.")
    kind, value = _source(walk, block, at, ("bytes", "text", "content"))
    if kind == "content":
        if not isinstance(value, list):
            raise wrong_type(f"{at}.source.content", "an array", value)
        for i, item in enumerate(value):
            _, text = union(walk, item, f"{at}.source.content[{i}]", ("text",), "document content block")
            _text(text, f"{at}.source.content[{i}].text")
    else:
        _text(value, f"{at}.source.{kind}")


def _guard_content(walk: Walk, payload: Any, at: str, needs: set[str]) -> None:
    kind, value = union(walk, payload, at, ("text", "image"), "guarded content")
    if kind == "image":
        _media(walk, "image", value, f"{at}.image", needs)
        return
    block = walk.object(value, f"{at}.text")
    walk.string(block, "text", f"{at}.text.", required=True)
    walk.strings(block, "qualifiers", f"{at}.text.")


def _reasoning(walk: Walk, payload: Any, at: str) -> None:
    kind, value = union(walk, payload, at, ("reasoningText", "redactedContent"), "reasoning block")
    if kind == "redactedContent":
        _text(value, f"{at}.redactedContent")  # the provider's own encrypted reasoning, base64
        return
    block = walk.object(value, f"{at}.reasoningText")
    walk.string(block, "text", f"{at}.reasoningText.", required=True)
    walk.string(block, "signature", f"{at}.reasoningText.")


def _citation(walk: Walk, value: Any, at: str) -> None:
    citation = walk.object(value, at)
    walk.string(citation, "title", f"{at}.")
    walk.string(citation, "source", f"{at}.")
    for i, item in enumerate(walk.array(citation, "sourceContent", f"{at}.") or ()):
        _, text = union(walk, item, f"{at}.sourceContent[{i}]", ("text",), "source content")
        _text(text, f"{at}.sourceContent[{i}].text")
    walk.mapping(citation, "location", f"{at}.")


def _system_block(walk: Walk, block: Any, at: str, needs: set[str]) -> None:
    kind, payload = union(walk, block, at, _SYSTEM_BLOCKS, "system block")
    if kind == "text":
        _text(payload, f"{at}.text")
    elif kind == "guardContent":
        _guard_content(walk, payload, f"{at}.guardContent", needs)
    else:
        walk.string(walk.object(payload, f"{at}.cachePoint"), "type", f"{at}.cachePoint.", required=True)


def _inference_config(walk: Walk, body: dict[str, Any]) -> None:
    config = walk.mapping(body, "inferenceConfig", "")
    if config is None:
        return
    walk.number(config, "temperature", "inferenceConfig.")
    walk.number(config, "topP", "inferenceConfig.")
    walk.strings(config, "stopSequences", "inferenceConfig.")


def _tool_config(walk: Walk, body: dict[str, Any]) -> None:
    config = walk.mapping(body, "toolConfig", "")
    if config is None:
        return
    tools = walk.required(config, "tools", "toolConfig.", list, "an array")
    if len(tools) > walk.limits.max_tools:
        raise too_many("tools", walk.limits.max_tools, "too_many_tools")
    for i, tool in enumerate(tools):
        at = f"toolConfig.tools[{i}]"
        kind, payload = union(walk, tool, at, ("toolSpec", "systemTool", "cachePoint"), "tool")
        spec = walk.object(payload, f"{at}.{kind}")
        if kind == "cachePoint":
            walk.string(spec, "type", f"{at}.cachePoint.", required=True)
            continue
        walk.string(spec, "name", f"{at}.{kind}.", required=True)
        if kind == "toolSpec":
            walk.string(spec, "description", f"{at}.toolSpec.")
            walk.boolean(spec, "strict", f"{at}.toolSpec.")
            schema = walk.required(spec, "inputSchema", f"{at}.toolSpec.", dict, "an object")
            union(walk, schema, f"{at}.toolSpec.inputSchema", ("json",), "input schema")
            walk.mapping(schema, "json", f"{at}.toolSpec.inputSchema.")
    choice = config.get("toolChoice")
    if choice is not None:
        kind, payload = union(walk, choice, "toolConfig.toolChoice", ("auto", "any", "tool"), "tool choice")
        named = walk.object(payload, f"toolConfig.toolChoice.{kind}")
        if kind == "tool":
            walk.string(named, "name", "toolConfig.toolChoice.tool.", required=True)


def _string_map(walk: Walk, body: dict[str, Any], name: str) -> None:
    mapping = walk.mapping(body, name, "")
    for key, value in (mapping or {}).items():
        if not isinstance(value, str):
            raise wrong_type(f"{name}.{printable(key)}", "a string", value)

