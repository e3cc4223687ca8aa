"""The text of a request or an answer, as filters and guards see it.

A filter sees a request as the strings the provider will read, each tagged with the
surface it sits on, and returns what to put in their place (the same object when it
changes nothing). Only fields whose meaning is known are *transformable*; every other
string — fields this gateway does not know, object keys, enum values, signed
reasoning — is still *read* (surface ``other`` or ``signed``), so what a filter finds
there is never silently let through; it just cannot be changed in place.
Binary payloads (image and document data) are not read: they are opaque content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.protocols.jsonbody import STRICT_DECODER, DuplicateMember, invalid
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pii.context import MemberValue
from portcullis.engine.pii.policy import OTHER

TextVisitor = Callable[[str, str], str]  # (surface, text) -> text
Handler = Callable[[Any], Any]  # a field's value -> the value to put back
# The surface of an answer's tool calls the provider ran itself (server tools, MCP).
PROVIDER_RUN = "provider_tool_arguments"


def visit_leaves(value: Any, surface: str, visit: TextVisitor, member: str | None = None) -> Any:
    """Every string and number in a JSON value; keys are read, never changed, so the
    document keeps its shape and stays valid for whatever schema it follows. A number
    is visited as its decimal text; one the visitor replaces becomes a JSON string
    (``{"card": 4111111111111111}`` masked is ``{"card": "4111********1111"}``). A
    member's value is visited as a ``MemberValue``, its name the context a detector
    may read (``{"ssn": 412557391}``)."""
    if isinstance(value, str) and not isinstance(value, _Number):
        if member is None:
            return visit(surface, value)
        result = visit(surface, MemberValue(value, member))
        return value if result == value else result  # never the wrapper itself
    if isinstance(value, (int, float, _Number)) and not isinstance(value, bool):
        written = str.__str__(value) if isinstance(value, _Number) else repr(value)
        result = visit(surface, written if member is None else MemberValue(written, member))
        return value if result == written else result
    if isinstance(value, dict):
        for key, item in value.items():
            visit(OTHER, key)
            value[key] = visit_leaves(item, surface, visit, key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = visit_leaves(item, surface, visit, member)  # the items of "cards": [...] are cards
    return value


def read_strings(value: Any, visit: TextVisitor, surface: str = OTHER) -> None:
    """Every string in a JSON value, keys included, and every number as its decimal
    text, read and never changed."""
    if isinstance(value, str):
        visit(surface, value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        visit(surface, repr(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            visit(surface, key)
            read_strings(item, visit, surface)
    elif isinstance(value, list):
        for item in value:
            read_strings(item, visit, surface)


def visit_members(document: dict[str, Any], handlers: Mapping[str, Handler], visit: TextVisitor) -> None:
    """Known members through their handlers, in the handlers' order (the order the
    model reads them); every other member read as ``other``."""
    for name, handle in handlers.items():
        if name in document:
            document[name] = handle(document[name])
    for name, value in document.items():
        if name not in handlers:
            visit(OTHER, name)
            read_strings(value, visit)


def members(handlers: Mapping[str, Handler], visit: TextVisitor) -> Handler:
    """A handler for an object value: its known members through ``handlers``."""

    def handle(value: Any) -> Any:
        if isinstance(value, dict):
            visit_members(value, handlers, visit)
        else:
            read_strings(value, visit)
        return value

    return handle


def each(handler: Handler) -> Handler:
    """A handler for an array value: every item through ``handler``."""

    def handle(value: Any) -> Any:
        if isinstance(value, list):
            for i, item in enumerate(value):
                value[i] = handler(item)
        return value

    return handle


def visit_schema(schema: Any, visit: TextVisitor) -> Any:
    """The prose inside a JSON Schema (descriptions, titles, comments, examples,
    defaults) is transformable; its structure (types, names, patterns, enums) is read."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("description", "title", "$comment") and isinstance(value, str):
                schema[key] = visit("tool_descriptions", value)
            elif key in ("examples", "default"):
                schema[key] = visit_leaves(value, "tool_descriptions", visit)
            elif key in ("enum", "const") or isinstance(value, str):
                read_strings(value, visit)
            else:
                visit(OTHER, key)
                visit_schema(value, visit)
    elif isinstance(schema, list):
        for item in schema:
            visit_schema(item, visit)
    return schema


# --- JSON held in a string (OpenAI tool-call arguments) ------------------------------------


class _Number(str):
    """A JSON number kept as written, so re-serialising changes no digit."""


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def visit_json_text(text: str, surface: str, visit: TextVisitor) -> str:
    """A JSON document held in a string: its string values are visited and, when one
    changed, the document is written again (numbers exactly as they were). It is
    parsed as strictly as a request body, so the provider cannot read a member the
    filter did not. Text that is not JSON is visited whole."""
    try:
        document = _strict(text)
    except DuplicateMember:
        raise invalid("tool-call arguments have a duplicated member") from None
    except (ValueError, RecursionError):
        return visit(surface, text)
    if _SURROGATE.search(text):
        try:
            _write(document).encode("utf-8")
        except UnicodeEncodeError:
            raise invalid("tool-call arguments contain an unpaired UTF-16 surrogate escape") from None
    changed = False

    def tracking(surface: str, leaf: str) -> str:
        nonlocal changed
        result = visit(surface, leaf)
        changed = changed or result is not leaf
        return result

    document = visit_leaves(document, surface, tracking)
    return _write(document) if changed else text


def _strict(text: str) -> Any:
    return json.JSONDecoder(object_pairs_hook=STRICT_DECODER.object_pairs_hook, parse_float=_Number, parse_int=_Number, parse_constant=_Number).decode(text)


def _write(value: Any) -> str:
    if isinstance(value, _Number):
        return str.__str__(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_write(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_write(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


# --- streams ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamText:
    """One piece of text in a stream event, in place: ``holder[key]``. ``channel``
    tells apart the pieces that continue each other (a content block, a tool call;
    for OpenAI a tuple whose first item is the choice); ``json`` says the text is
    JSON source, so what goes into it must be escaped; ``signed`` says it is reasoning
    the provider signed or keeps as is: it may be read and moved between events of its
    channel, never changed; ``arguments`` says it is a tool call's arguments, which
    the tool-call guard judges whole; ``repeat`` says it is a whole copy of text the
    stream already carried in pieces (Responses' ``.done`` events): changed the same
    way, but what is found in it was counted already."""

    channel: Any
    holder: dict[str, Any]
    key: str
    json: bool = False
    signed: bool = False
    arguments: bool = False
    repeat: bool = False


ALL_CHANNELS = "*"  # what a stream's end closes
_KIND = re.compile(r"[a-z][a-z0-9_]{0,40}")


def content_kind(kind: Any) -> str:
    """A content type's name as error messages and audit records may show it."""
    return kind if isinstance(kind, str) and _KIND.fullmatch(kind) else "unknown"


# --- untrusted content -----------------------------------------------------------------------


def wrap_untrusted(content: Any, boundary: Boundary, source: str, **attributes: str | None) -> Any | None:
    """Content between untrusted boundaries: a string wrapped as one, a list of content
    parts (both protocols' ``{"type": "text", ...}`` shape) between two text parts, every
    string inside cleaned of the boundary. None for anything else, which stays as it is."""
    if isinstance(content, str):
        return boundary.wrap(content, source, **attributes)
    if isinstance(content, list):
        visit_leaves(content, "tool_results", lambda _, text: boundary.clean(text))
        return [{"type": "text", "text": boundary.opening(source, **attributes)}, *content, {"type": "text", "text": boundary.closing()}]
    return None


# --- tool calls in answers --------------------------------------------------------------------

MAX_HELD_TOOL_CALL_BYTES = 4 * 1024 * 1024  # a longer call is not inspected: it is denied
TOO_LARGE_TO_INSPECT = "the call is too large for the gateway to inspect"


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made, complete: ``arguments`` as parsed JSON, or None when
    they are not valid JSON (such a call cannot be inspected)."""

    name: str
    arguments: Any


def tool_call(name: Any, arguments: Any) -> ToolCall:
    """A call from its name and its arguments as the protocol holds them (an object, or
    JSON text)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = None
    return ToolCall(name if isinstance(name, str) else "", arguments)


def denial_text(call: ToolCall, reason: str) -> str:
    """What the client sees instead of a denied call: the tool and why, no arguments."""
    return f"[Portcullis] The gateway's policy denied a call to the tool {_printable_name(call.name)}: {reason}."


def _printable_name(name: str) -> str:
    clipped = "".join(c if c.isprintable() else "?" for c in name[:64])
    return f"`{clipped}`" if clipped else "(unnamed)"
