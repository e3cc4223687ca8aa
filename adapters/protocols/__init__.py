"""Wire protocols. Each module speaks one protocol in both roles: as *ingress* it
parses and validates what a client sends and renders errors the client's SDK
understands; as *egress* it prepares the upstream request and reads usage from the
provider's answer. Conversions live in modules named after the pair they join
(``openai_chat_anthropic_messages``: a Chat client served by a Messages provider)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError

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


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise invalid("request body is empty: expected a JSON object")
    try:
        body = json.loads(raw.decode("utf-8"))  # decoded first: json.loads would guess UTF-16/32 from bytes
    except UnicodeDecodeError:
        raise invalid("request body is not UTF-8") from None
    except ValueError as error:
        # The decoder's message gives position only, never content.
        raise invalid(f"request body is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
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
