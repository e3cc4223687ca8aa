"""OpenAI Responses (``POST /v1/responses``) on the wire, as ingress and as egress.

The gateway keeps no response store, so ``previous_response_id`` and ``conversation``
(turns the provider would add from its own storage, which no filter or meter saw) are
refused: clients send the whole ``input`` every turn, as Codex does over HTTP with
``store: false``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.jsonbody import invalid, optional_bool, optional_positive_int, parse_json_object, reasoning_effort, require_string
from portcullis.adapters.protocols.openai_errors import error_object
from portcullis.adapters.protocols.openai_responses import validator
from portcullis.adapters.protocols.openai_responses.surfaces import declared_tools
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest
from portcullis.adapters.protocols.sse import SSE_FRAMING, SSEEvent, encode
from portcullis.engine.errors import GatewayError
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = "openai_responses"
UPSTREAM_PATH = "/responses"  # appended to a base_url that ends in /v1, as OpenAI SDKs expect
FRAMING = SSE_FRAMING
TOKEN_COUNT_EXACT = True  # OpenAI counts input as tiktoken does
_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    body = parse_json_object(raw)
    model = require_string(body, "model")
    for stored in ("previous_response_id", "conversation"):  # the provider would add turns the gateway never saw
        if body.get(stored) is not None:
            raise invalid(f"{stored}: not supported by this gateway, which keeps no responses; send the whole conversation in input")
    if "input" not in body:
        raise invalid("input: field required")
    stream = optional_bool(body, "stream")
    max_tokens = optional_positive_int(body, "max_output_tokens")
    images = validator.validate(body, limits)
    requires = ["streaming"] if stream else []
    if body.get("tools"):
        requires.append("tools")
    if images:
        requires.append("vision")
    settings = body.get("reasoning")
    effort = reasoning_effort(settings.get("effort")) if isinstance(settings, dict) else None
    return ParsedRequest(NAME, raw, body, model, stream, max_tokens, requires, tools=declared_tools(body), reasoning_effort=effort)


def client_wants_usage(request: ParsedRequest) -> bool:
    """A Responses stream always reports usage, in its final event."""
    return True


# --- errors -----------------------------------------------------------------------


def error_headers(error: GatewayError, request_id: str) -> dict[str, str]:
    return {}


def error_status(error: GatewayError) -> int:
    return error.kind.status


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"error": error_object(error)}).encode()


def stream_error(error: GatewayError) -> bytes:
    """An ``error`` event: ``code``, ``message`` and ``param`` where the Responses event
    has them, and the error object under ``error`` too, which is what the openai SDK
    raises an ``APIError`` on. The gateway writes it outside the provider's numbering,
    so its ``sequence_number`` is 0."""
    detail = error_object(error)
    document = {"type": "error", "code": detail["code"], "message": detail["message"], "param": None, "sequence_number": 0, "error": detail}
    return encode(document, "error")



# --- egress -----------------------------------------------------------------------


def upstream_path(model: str, stream: bool) -> str:
    return UPSTREAM_PATH


def require_guardrail(body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes:
    return body  # guardrails are Bedrock's: the policy requires them of Bedrock targets only


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes, with the model swapped when the names differ and, when the
    output must stay within ``ceiling`` (None: it need not), ``max_output_tokens`` set to
    it if missing or larger. Usage needs no edit: every Responses answer reports it."""
    raw = request.raw
    if request.body.get("model") != upstream_model:
        raw = set_member(raw, "model", upstream_model)
    if ceiling is not None and (request.max_tokens is None or request.max_tokens > ceiling):
        raw = set_member(raw, "max_output_tokens", ceiling)
    return raw


def cap_output(body: dict[str, Any], ceiling: int) -> None:
    body["max_output_tokens"] = min(body.get("max_output_tokens") or ceiling, ceiling)


def compose(model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of the gateway's own (a classifier's), deterministic, not stored."""
    return {"model": model, "instructions": instructions, "input": user, "max_output_tokens": max_tokens, "temperature": 0, "store": False}


def answer_text(document: Mapping[str, Any]) -> str:
    """The output_text parts of the answer's message items, joined; a ValueError when it
    is not shaped as a response."""
    try:
        output = document["output"]
        return "".join(
            part.get("text", "")
            for item in output
            if item.get("type") == "message"
            for part in item.get("content") or ()
            if part.get("type") == "output_text"
        )
    except (KeyError, TypeError, AttributeError):
        raise ValueError("the answer is not a Responses response") from None


def is_error_event(event: SSEEvent) -> bool:
    if event.event in ("error", "response.failed"):
        return True
    if '"error"' not in event.data and '"response.failed"' not in event.data:
        return False
    try:
        document = event.json()
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("type") in ("error", "response.failed")


def usage_of(document: Mapping[str, Any]) -> Usage | None:
    """The usage a response reports (output includes reasoning tokens), or None when it
    reports none (unknown, not zero)."""
    usage = document.get("usage")
    if not isinstance(usage, Mapping) or "input_tokens" not in usage or "output_tokens" not in usage:
        return None
    details = usage.get("input_tokens_details")
    cached = int((details.get("cached_tokens") if isinstance(details, Mapping) else 0) or 0)
    return Usage(input=int(usage.get("input_tokens") or 0) - cached, output=int(usage.get("output_tokens") or 0), cache_read=cached)


def is_usage_only(document: Mapping[str, Any]) -> bool:
    """Responses has no event that carries only usage."""
    return False


def intervened(document: Mapping[str, Any]) -> bool:
    return False  # its providers have no guard of their own that the gateway reports


class StreamUsage:
    """Usage read off a Responses stream: the final event (``response.completed`` or
    ``response.incomplete``, and ``response.failed``) carries the response with its
    usage. The first two end a stream properly."""

    intervened = False

    def __init__(self) -> None:
        self.usage = Usage()
        self.complete = False
        self.known = False

    def feed(self, event: SSEEvent) -> None:
        if not any(name in event.data for name in _FINAL_EVENTS):
            return
        try:
            document = event.json()
        except ValueError:
            return
        if not isinstance(document, dict) or document.get("type") not in _FINAL_EVENTS:
            return
        self.complete = self.complete or document["type"] != "response.failed"
        response = document.get("response")
        reported = usage_of(response) if isinstance(response, dict) else None
        if reported is not None:
            self.usage, self.known = reported, True
