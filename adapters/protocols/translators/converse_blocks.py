"""Content between Anthropic Messages and Bedrock Converse, both ways, as both
translators that pair them need it: system text, content blocks, tool results, tool
and prompt-cache markers (tool definitions: ``converse_tools``).

The two protocols describe the same model calls, so most blocks map one to one. Where
they differ:

- A cache marker is a member of the block in Messages (``cache_control``) and a
  block of its own in Converse (``{"cachePoint": {"type": "default"}}``) that follows
  the block the cached prefix ends with.
- Converse documents need a name (shown to the model, and restricted to letters,
  digits, single spaces, hyphens, parentheses and brackets): a Messages document's
  ``title`` is the name when it fits, a neutral ``document-N`` when it has none; a
  title that does not fit is refused rather than silently renamed.
- Converse sends media as bytes only (base64 on the wire): URL and file sources are
  refused, as are media types the other side has no format for.
- A Converse ``json`` tool result has no Messages form but its text, so it travels as
  JSON text.

Errors name the client's own field paths: ``to_converse_*`` read a Messages request,
``to_messages_*`` a Converse request."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from portcullis.adapters.protocols.jsonbody import client_index, invalid
from portcullis.engine.errors import excerpt

CONVERSE = "Bedrock Converse"
MESSAGES = "Anthropic Messages"
# The stop reasons both protocols name alike; each direction adds the ones they name apart.
SAME_STOP_REASONS = {reason: reason for reason in ("end_turn", "tool_use", "max_tokens", "stop_sequence", "model_context_window_exceeded")}

IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
IMAGE_MEDIA_TYPES = {fmt: media for media, fmt in IMAGE_FORMATS.items()}
_CACHE_TTLS = ("5m", "1h")
_DOCUMENT_NAME = re.compile(r"[A-Za-z0-9()\[\]-]+( [A-Za-z0-9()\[\]-]+)*")


def each_turn(messages: Any, target: str) -> Iterator[tuple[str, Any, str]]:
    """Each message's role, content and field path. Both protocols' turns are a user or
    assistant role with content, so both directions refuse the same malformed ones."""
    if not isinstance(messages, list):
        raise invalid("messages: expected an array")
    for i, message in enumerate(messages):
        where = f"messages[{client_index(messages, i)}]"
        if not isinstance(message, dict):
            raise invalid(f"{where}: expected an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role: {excerpt(role)} cannot be converted for {target}")
        yield role, message.get("content"), where


# --- Messages → Converse ---------------------------------------------------------------


class DocumentNames:
    """The names a converted request's documents get: each once."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def name(self, title: Any, where: str) -> str:
        if title is not None:
            if not isinstance(title, str) or len(title) > 200 or not _DOCUMENT_NAME.fullmatch(title) or title in self._used:
                raise invalid(
                    f"{where}.title: {CONVERSE} names documents with letters, digits, single spaces, hyphens, parentheses and brackets only, each name once"
                )
            self._used.add(title)
            return title
        number = len(self._used) + 1
        while f"document-{number}" in self._used:
            number += 1
        self._used.add(f"document-{number}")
        return f"document-{number}"


def cache_point(cache_control: Any, where: str) -> dict[str, Any]:
    if not isinstance(cache_control, dict) or cache_control.get("type") != "ephemeral":
        raise invalid(f"{where}: only ephemeral cache markers can be converted for {CONVERSE}")
    point: dict[str, Any] = {"type": "default"}
    ttl = cache_control.get("ttl")
    if ttl is not None:
        if ttl not in _CACHE_TTLS:
            raise invalid(f"{where}.ttl: {CONVERSE} caches for 5m or 1h")
        point["ttl"] = ttl
    return {"cachePoint": point}


def to_converse_system(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}] if system else []
    if not isinstance(system, list):
        raise invalid("system: expected a string or an array of text blocks")
    out: list[dict[str, Any]] = []
    for j, block in enumerate(system):
        at = f"system[{client_index(system, j)}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"{at}: only text blocks can be converted for {CONVERSE}")
        out.append({"text": string_member(block, "text", at)})
        if block.get("cache_control") is not None:
            out.append(cache_point(block["cache_control"], f"{at}.cache_control"))
    return out


def to_converse_content(content: Any, where: str, documents: DocumentNames) -> list[dict[str, Any]]:
    """A Messages turn's content as Converse blocks; ``where`` names its ``content``."""
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}: expected a string or an array of content blocks")
    out: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}[{client_index(content, j)}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result, cached = _converse_tool_result(block, at, documents)
            out.append(result)
        else:
            out.append(_converse_block(kind, block, at, documents))
            cached = block.get("cache_control") is not None
        if cached:
            out.append(cache_point(block.get("cache_control") or {"type": "ephemeral"}, f"{at}.cache_control"))
    return out


def _converse_block(kind: Any, block: Any, at: str, documents: DocumentNames) -> dict[str, Any]:
    if kind == "text":
        return {"text": string_member(block, "text", at)}
    if kind == "image":
        return {"image": _converse_image(block.get("source"), f"{at}.source")}
    if kind == "document":
        return {"document": _converse_document(block, at, documents)}
    if kind == "tool_use":
        tool_input = block.get("input", {})
        if not isinstance(tool_input, dict):
            raise invalid(f"{at}.input: expected an object")
        return {"toolUse": {"toolUseId": string_member(block, "id", at), "name": string_member(block, "name", at), "input": tool_input}}
    if kind == "thinking":
        reasoning: dict[str, Any] = {"text": string_member(block, "thinking", at)}
        if block.get("signature") is not None:
            reasoning["signature"] = string_member(block, "signature", at)
        return {"reasoningContent": {"reasoningText": reasoning}}
    if kind == "redacted_thinking":
        data = string_member(block, "data", at)
        if not _is_base64(data):
            raise invalid(f"{at}.data: {CONVERSE} carries redacted reasoning as base64 bytes; this is not base64")
        return {"reasoningContent": {"redactedContent": data}}
    raise invalid(f"{at}: block type {excerpt(kind)} cannot be converted for {CONVERSE}")


def _converse_tool_result(block: Mapping[str, Any], at: str, documents: DocumentNames) -> tuple[dict[str, Any], bool]:
    """The result, and whether a cache marker follows it: Converse has none inside a
    result, so a marker on the result or on any of its blocks follows the result."""
    content = block.get("content")
    cached = block.get("cache_control") is not None
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        blocks = [{"text": content}] if content else []
    elif isinstance(content, list):
        for k, inner in enumerate(content):
            kind = inner.get("type") if isinstance(inner, dict) else None
            if kind not in ("text", "image", "document"):
                raise invalid(f"{at}.content[{k}]: block type {excerpt(kind)} cannot be converted for {CONVERSE}")
            blocks.append(_converse_block(kind, inner, f"{at}.content[{k}]", documents))
            cached = cached or inner.get("cache_control") is not None
    elif content is not None:
        raise invalid(f"{at}.content: expected a string or an array of content blocks")
    result: dict[str, Any] = {"toolUseId": string_member(block, "tool_use_id", at), "content": blocks}
    if block.get("is_error"):
        result["status"] = "error"
    return {"toolResult": result}, cached


def _converse_image(source: Any, where: str) -> dict[str, Any]:
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise invalid(f"{where}: only base64 images can be converted for {CONVERSE} (it takes the bytes, not a URL or file)")
    media_type = source.get("media_type")
    if media_type not in IMAGE_FORMATS:
        raise invalid(f"{where}.media_type: {excerpt(media_type)} cannot be converted for {CONVERSE}")
    return {"format": IMAGE_FORMATS[media_type], "source": {"bytes": string_member(source, "data", where)}}


def _converse_document(block: Mapping[str, Any], at: str, documents: DocumentNames) -> dict[str, Any]:
    source, where = block.get("source"), f"{at}.source"
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and source.get("media_type") == "application/pdf":
        converted: dict[str, Any] = {"format": "pdf", "source": {"bytes": string_member(source, "data", where)}}
    elif kind == "text" and source.get("media_type", "text/plain") == "text/plain":
        converted = {"format": "txt", "source": {"bytes": base64.b64encode(string_member(source, "data", where).encode()).decode()}}
    else:
        raise invalid(f"{where}: only base64 PDF and plain-text documents can be converted for {CONVERSE}")
    converted["name"] = documents.name(block.get("title"), at)
    if isinstance(block.get("context"), str) and block["context"]:
        converted["context"] = block["context"]
    citations = block.get("citations")
    if isinstance(citations, dict) and "enabled" in citations:
        converted["citations"] = {"enabled": bool(citations["enabled"])}
    return converted


# --- Converse → Messages ---------------------------------------------------------------


def to_messages_system(system: Any) -> list[dict[str, Any]]:
    if not isinstance(system, list):
        raise invalid("system: expected an array")
    out: list[dict[str, Any]] = []
    for j, block in enumerate(system):
        kind, value, at = union_member(block, f"system[{j}]")
        if kind == "cachePoint":
            _mark(out, value, at)
        elif kind == "text" and isinstance(value, str):
            out.append({"type": "text", "text": value})
        else:
            raise invalid(f"{at}.{kind}: cannot be converted for {MESSAGES}")
    return out


def to_messages_content(blocks: Any, where: str) -> list[dict[str, Any]]:
    """A Converse message's blocks as Messages blocks; ``where`` names its ``content``."""
    if not isinstance(blocks, list):
        raise invalid(f"{where}: expected an array")
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, value, at = union_member(block, f"{where}[{client_index(blocks, j)}]")
        if kind == "cachePoint":
            _mark(out, value, at)
        else:
            out.append(_messages_block(kind, value, at))
    return out


def union_member(block: Any, at: str) -> tuple[str, Any, str]:
    # Converse blocks are unions: exactly one member says what the block is.
    if not isinstance(block, dict) or len(block) != 1:
        raise invalid(f"{at}: expected an object with exactly one member")
    ((kind, value),) = block.items()
    return kind, value, at


def _mark(blocks: list[dict[str, Any]], point: Any, at: str) -> None:
    if not blocks or blocks[-1]["type"] in ("thinking", "redacted_thinking"):
        raise invalid(f"{at}.cachePoint: {MESSAGES} marks a cached prefix on the text, media or tool block it ends with")
    blocks[-1]["cache_control"] = cache_marker(point, at)


def cache_marker(point: Any, at: str) -> dict[str, Any]:
    if not isinstance(point, dict) or point.get("type") != "default":
        raise invalid(f'{at}.cachePoint.type: expected "default"')
    marker: dict[str, Any] = {"type": "ephemeral"}
    if point.get("ttl") is not None:
        if point["ttl"] not in _CACHE_TTLS:
            raise invalid(f"{at}.cachePoint.ttl: expected 5m or 1h")
        marker["ttl"] = point["ttl"]
    return marker


def _messages_block(kind: str, value: Any, at: str) -> dict[str, Any]:
    where = f"{at}.{kind}"
    if kind == "text" and isinstance(value, str):
        return {"type": "text", "text": value}
    if not isinstance(value, dict):
        raise invalid(f"{where}: cannot be converted for {MESSAGES}")
    if kind == "image":
        return {"type": "image", "source": _messages_image(value, where)}
    if kind == "document":
        return _messages_document(value, where)
    if kind == "toolUse":
        tool_input = value.get("input", {})
        if not isinstance(tool_input, dict):
            raise invalid(f"{where}.input: expected an object")
        return {"type": "tool_use", "id": string_member(value, "toolUseId", where), "name": string_member(value, "name", where), "input": tool_input}
    if kind == "toolResult":
        return _messages_tool_result(value, where)
    if kind == "reasoningContent":
        return _messages_reasoning(value, where)
    raise invalid(f"{where}: cannot be converted for {MESSAGES}")


def _messages_image(image: Mapping[str, Any], where: str) -> dict[str, Any]:
    media_type = IMAGE_MEDIA_TYPES.get(image.get("format"))
    if media_type is None:
        raise invalid(f"{where}.format: {excerpt(image.get('format'))} cannot be converted for {MESSAGES}")
    source = image.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("bytes"), str):
        raise invalid(f"{where}.source: only image bytes can be converted for {MESSAGES} (not an S3 location)")
    return {"type": "base64", "media_type": media_type, "data": source["bytes"]}


def _messages_document(document: Mapping[str, Any], where: str) -> dict[str, Any]:
    fmt, source = document.get("format"), document.get("source")
    if not isinstance(source, dict) or len(source) != 1:
        raise invalid(f"{where}.source: expected an object with exactly one member")
    if fmt == "pdf" and isinstance(source.get("bytes"), str):
        converted: dict[str, Any] = {"type": "base64", "media_type": "application/pdf", "data": source["bytes"]}
    elif fmt == "txt" and isinstance(source.get("bytes"), str):
        converted = {"type": "text", "media_type": "text/plain", "data": _utf8(source["bytes"], f"{where}.source.bytes")}
    elif fmt in ("txt", None) and isinstance(source.get("text"), str):
        converted = {"type": "text", "media_type": "text/plain", "data": source["text"]}
    elif fmt in ("txt", None) and isinstance(source.get("content"), list):
        parts = [_text_member(part, f"{where}.source.content[{k}]") for k, part in enumerate(source["content"])]
        converted = {"type": "content", "content": [{"type": "text", "text": text} for text in parts]}
    else:
        raise invalid(f"{where}: only PDF and plain-text documents given as bytes or text can be converted for {MESSAGES}")
    block: dict[str, Any] = {"type": "document", "source": converted, "title": string_member(document, "name", where)}
    if isinstance(document.get("context"), str):
        block["context"] = document["context"]
    citations = document.get("citations")
    if isinstance(citations, dict) and "enabled" in citations:
        block["citations"] = {"enabled": bool(citations["enabled"])}
    return block


def _messages_tool_result(result: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = result.get("content")
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected an array")
    blocks = []
    for k, block in enumerate(content):
        kind, value, at = union_member(block, f"{where}.content[{k}]")
        if kind == "json":  # no Messages form but its text
            blocks.append({"type": "text", "text": json.dumps(value, ensure_ascii=False)})
        elif kind in ("text", "image", "document"):
            blocks.append(_messages_block(kind, value, at))
        else:
            raise invalid(f"{at}.{kind}: cannot be converted for {MESSAGES}")
    converted: dict[str, Any] = {"type": "tool_result", "tool_use_id": string_member(result, "toolUseId", where), "content": blocks}
    status = result.get("status")
    if status not in (None, "success", "error"):
        raise invalid(f"{where}.status: expected success or error")
    if status == "error":
        converted["is_error"] = True
    return converted


def _messages_reasoning(reasoning: Mapping[str, Any], where: str) -> dict[str, Any]:
    if len(reasoning) != 1:
        raise invalid(f"{where}: expected an object with exactly one member")
    if isinstance(reasoning.get("redactedContent"), str):
        return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    text = reasoning.get("reasoningText")
    if not isinstance(text, dict):
        raise invalid(f"{where}: cannot be converted for {MESSAGES}")
    if not isinstance(text.get("signature"), str):
        raise invalid(f"{where}.reasoningText.signature: {MESSAGES} takes earlier reasoning back only with its signature")
    return {"type": "thinking", "thinking": string_member(text, "text", f"{where}.reasoningText"), "signature": text["signature"]}


# --- shared ----------------------------------------------------------------------------


def string_member(block: Mapping[str, Any], name: str, where: str) -> str:
    value = block.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}: expected a string")
    return value


def _text_member(block: Any, at: str) -> str:
    kind, value, at = union_member(block, at)
    if kind != "text" or not isinstance(value, str):
        raise invalid(f"{at}: only text can be converted for {MESSAGES}")
    return value


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _utf8(data: str, where: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise invalid(f"{where}: a plain-text document must be base64 of UTF-8 text") from None
