"""The JSON of a request body, read strictly, and the field helpers every protocol's
parser shares."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.engine.errors import ErrorKind, GatewayError, printable


class DuplicateMember(ValueError):
    """A member named twice in one object; ``name`` is which."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which duplicate wins; the gateway must judge exactly what
    # the provider will read, so a body with a duplicated member is refused.
    members: dict[str, Any] = {}
    for name, value in pairs:
        if name in members:
            raise DuplicateMember(name)
        members[name] = value
    return members


class _NonStandardNumber(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON (RFC 8259); Python's parser takes them, a provider would not.
    raise _NonStandardNumber(name)


STRICT_DECODER = json.JSONDecoder(object_pairs_hook=unique_members, parse_constant=_refuse_constant)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a 400 that says what is wrong (never where
    the body's content is concerned: messages give positions, not text)."""
    if not raw.strip():
        raise invalid("request body is empty: expected a JSON object")
    try:
        text = _utf8(raw)  # decoded first: json.loads would guess UTF-16/32 from bytes
        body = STRICT_DECODER.decode(text)
    except UnicodeDecodeError:
        raise invalid("request body is not UTF-8") from None
    except DuplicateMember as duplicate:
        raise invalid(f"request body has a duplicated member: {printable(duplicate.name)}") from None
    except _NonStandardNumber:
        raise invalid("request body is not valid JSON (NaN and Infinity are not JSON numbers)") from None
    except json.JSONDecodeError as error:
        raise invalid(f"request body is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except (ValueError, RecursionError):
        raise invalid("request body is not acceptable JSON (nesting too deep or a number too long)") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    if _has_surrogate_escape(text):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise invalid("request body contains an unpaired UTF-16 surrogate escape") from None
    return body


# Large bodies are handled in slices: each C-level step holds the GIL, and one step over
# 15 MB (~20 ms) is time the event loop, on another thread, cannot run.
_SLICE = 1 << 20


def _utf8(raw: bytes) -> str:
    if len(raw) <= _SLICE:
        return raw.decode("utf-8")
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts = [decoder.decode(raw[start : start + _SLICE]) for start in range(0, len(raw), _SLICE)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


def _has_surrogate_escape(text: str) -> bool:
    overlap = 5  # an escape that straddles two slices is still found
    return any(_SURROGATE_ESCAPE.search(text, start, start + _SLICE + overlap) for start in range(0, len(text), _SLICE))


def invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message, code="invalid_request")


def forwarded_headers(headers: Mapping[str, str], names: tuple[str, ...], limits: RequestLimits) -> dict[str, str]:
    """The client headers a protocol forwards upstream, each within the header cap: a
    provider refuses an oversized one anyway, so it is refused here, in the client's terms."""
    forward = {}
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        if len(value) > limits.max_header_bytes:
            raise GatewayError(
                ErrorKind.HEADERS_TOO_LARGE, f"header {name} is longer than this gateway forwards ({limits.max_header_bytes} bytes)", code="header_too_large"
            )
        forward[name] = value
    return forward


class Inserted(dict):  # type: ignore[type-arg]
    """A message or block the gateway added to the client's request (the policy prompt).
    It serialises like any object; error paths skip it, so they keep the client's indexing."""


def client_index(items: list[Any], position: int) -> int:
    """The client's index of ``items[position]``: the gateway's own insertions before it
    do not count."""
    return position - sum(1 for item in items[:position] if isinstance(item, Inserted))


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


def optional_positive_int(body: Mapping[str, Any], name: str, where: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid(f"{where}{name}: expected a positive integer")
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
    """The message of a provider error body: ``error.message`` (Anthropic, OpenAI),
    ``message`` (Bedrock), or the message of a Bedrock stream exception
    (``{"throttlingException": {"message": ...}}``)."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("error"), dict):
        body = body["error"]
    elif len(body) == 1 and isinstance(next(iter(body.values())), dict):
        body = next(iter(body.values()))
    message = body.get("message", body.get("Message"))
    return message if isinstance(message, str) else None


def reasoning_budget(settings: Any, where: str) -> int | None:
    """The reasoning budget of a ``thinking`` setting turned on (``{"type": "enabled",
    "budget_tokens": N}``, as Messages and Bedrock's Claude models take it), or None."""
    if not isinstance(settings, dict) or settings.get("type") != "enabled" or settings.get("budget_tokens") is None:
        return None
    return optional_positive_int(settings, "budget_tokens", where)


def reasoning_effort(value: Any) -> str | None:
    """A named reasoning effort (``low``, ``high``, ...), which carries no token number."""
    return value if isinstance(value, str) and value else None
