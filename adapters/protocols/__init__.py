"""Wire protocols. Each module speaks one protocol in both roles: as *ingress* it
parses and validates what a client sends and renders errors the client's SDK
understands; as *egress* it prepares the upstream request and reads usage from the
provider's answer. Conversions live in modules named after the pair they join
(``openai_chat_anthropic_messages``: a Chat client served by a Messages provider)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError, printable
from portcullis.engine.pii.policy import SIGNED as SIGNED  # text a filter may read but never change

ANTHROPIC_MESSAGES = "anthropic_messages"
OPENAI_CHAT = "openai_chat"


@dataclass
class ParsedRequest:
    """A client request after ingress validation: the body as sent (``raw``, the
    fast-path candidate) and as parsed, plus what the policy needs to know."""

    protocol: str
    raw: bytes
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    requires: list[str]
    forward_headers: dict[str, str] = field(default_factory=dict)
    query: str = ""
    choices: int = 1  # completions the request asks for (OpenAI `n`): each can use max_tokens
    # Set when a hard limit governs the request: every upstream body then names an output
    # limit no larger than the target's ceiling, so the reserved bound really bounds it.
    cap_output: bool = False
    session: str | None = None  # the client's conversation id, when it sends one


class _DuplicateMember(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which duplicate wins; the gateway must judge exactly what
    # the provider will read, so a body with a duplicated member is refused.
    members: dict[str, Any] = {}
    for name, value in pairs:
        if name in members:
            raise _DuplicateMember(name)
        members[name] = value
    return members


_decoder = json.JSONDecoder(object_pairs_hook=_unique_members)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a 400 that says what is wrong (never where
    the body's content is concerned: messages give positions, not text)."""
    if not raw.strip():
        raise invalid("request body is empty: expected a JSON object")
    try:
        text = raw.decode("utf-8")  # decoded first: json.loads would guess UTF-16/32 from bytes
        body = _decoder.decode(text)
    except UnicodeDecodeError:
        raise invalid("request body is not UTF-8") from None
    except _DuplicateMember as duplicate:
        raise invalid(f"request body has a duplicated member: {printable(duplicate.name)}") from None
    except json.JSONDecodeError as error:
        raise invalid(f"request body is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except (ValueError, RecursionError):
        raise invalid("request body is not acceptable JSON (nesting too deep or a number too long)") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise invalid("request body contains an unpaired UTF-16 surrogate escape") from None
    return body


def invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message)


def require_string(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise invalid(f"{name}: field required")
    if not isinstance(value, str) or not value:
        raise invalid(f"{name}: expected a non-empty string")
    return value


def optional_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name}: expected a boolean")
    return value


def optional_positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid(f"{name}: expected a positive integer")
    return value


def require_list(body: Mapping[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if value is None:
        raise invalid(f"{name}: field required")
    if not isinstance(value, list):
        raise invalid(f"{name}: expected an array")
    return value


def optional_list(body: Mapping[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"{name}: expected an array")
    return value


def error_message(body: Any) -> str | None:
    """The message of a provider error body; both protocols nest it as error.message."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
        return message if isinstance(message, str) else None
    return None


# --- prompt and answer text, for filters and guards ---------------------------------------
#
# Filters see a request as the strings the provider will read, each tagged with the
# surface it sits on; guards see an answer's strings the same way. A visitor returns
# the string to put in its place (the same object when it changes nothing).

SURFACES = ("text", "tool_descriptions", "tool_arguments", "tool_results")

TextVisitor = Callable[[str, str], str]  # (surface, text) -> text


def visit_leaves(value: Any, surface: str, visit: TextVisitor) -> Any:
    """Every string leaf of a JSON value (values, not keys): the shape and every other
    type stay as they are, so the JSON stays valid for whatever schema it follows."""
    if isinstance(value, str):
        return visit(surface, value)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = visit_leaves(item, surface, visit)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = visit_leaves(item, surface, visit)
    return value


def visit_json_text(text: str, surface: str, visit: TextVisitor) -> str:
    """A JSON document held in a string (OpenAI tool-call arguments): its string leaves
    are visited and, when one changed, the document is serialised again. Text that is
    not JSON is visited whole."""
    try:
        document = json.loads(text)
    except ValueError:
        return visit(surface, text)
    changed = False

    def tracking(surface: str, leaf: str) -> str:
        nonlocal changed
        result = visit(surface, leaf)
        changed = changed or result is not leaf
        return result

    document = visit_leaves(document, surface, tracking)
    return json.dumps(document, ensure_ascii=False) if changed else text


def visit_schema(schema: Any, visit: TextVisitor) -> None:
    """The prose inside a tool's JSON Schema (descriptions, titles, examples, defaults),
    not its structure (types, property names, patterns, enums)."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("description", "title") and isinstance(value, str):
                schema[key] = visit("tool_descriptions", value)
            elif key in ("examples", "default"):
                schema[key] = visit_leaves(value, "tool_descriptions", visit)
            else:
                visit_schema(value, visit)
    elif isinstance(schema, list):
        for item in schema:
            visit_schema(item, visit)


@dataclass(frozen=True)
class StreamText:
    """One piece of text in a stream event, in place: ``holder[key]``. ``channel``
    tells apart the pieces that continue each other (a content block, a tool call);
    ``json`` says the text is JSON source, so what goes into it must be escaped."""

    channel: Any
    holder: dict[str, Any]
    key: str
    json: bool = False


ALL_CHANNELS = "*"  # what a stream's end closes
_KIND = re.compile(r"[a-z][a-z0-9_]{0,40}")


def content_kind(kind: Any) -> str:
    """A content type's name as error messages and audit records may show it."""
    return kind if isinstance(kind, str) and _KIND.fullmatch(kind) else "unknown"
