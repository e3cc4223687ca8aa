"""Bedrock Runtime InvokeModel for Anthropic models (``POST /model/{modelId}/invoke``
and ``/invoke-with-response-stream``) on the wire, as ingress and as egress.

The body is a Messages body without ``model`` and ``stream`` (the path says both) and
with ``anthropic_version``; the answer is a Messages answer, and each ``chunk`` frame
of a stream carries one Messages event, which the framing unwraps. So everything but
the envelope, the framing and the errors is the Messages protocol's own, reused."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols import aws_errors
from portcullis.adapters.protocols.anthropic_messages import wire as messages
from portcullis.adapters.protocols.aws_errors import NO_TRACE
from portcullis.adapters.protocols.bedrock_invoke import envelope
from portcullis.adapters.protocols.bedrock_paths import model_path, path_model
from portcullis.adapters.protocols.eventstream import INVOKE_FRAMING, FramedEvent
from portcullis.adapters.protocols.jsonbody import invalid, parse_json_object
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.engine.pricing import Usage
from portcullis.engine.rawjson import set_member

NAME = "bedrock_invoke"
FRAMING = INVOKE_FRAMING
TOKEN_COUNT_EXACT = False  # Claude's tokenizer, as for Messages
STREAM_ACTION = "invoke-with-response-stream"
METRICS = "amazon-bedrock-invocationMetrics"  # what Bedrock adds to an answer: token counts and latencies

# The same as a Messages body's.
answer_text = messages.answer_text
cap_output = messages.cap_output
is_usage_only = messages.is_usage_only


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    """The model and the stream from the path, the envelope checked, the rest validated
    as a Messages body. Of the client's headers only its own guardrail goes on (to a
    Bedrock target, unless the policy requires another): the body's beta list stands in
    for the ``anthropic-beta`` header an Anthropic provider would read."""
    model = path_model(path)
    body = parse_json_object(raw)
    envelope.check_envelope(body)
    request = messages.messages_request(NAME, raw, body, model, limits, stream=path.get("action") == STREAM_ACTION)
    request.forward_headers = {**envelope.beta_header(body, limits), **_client_guardrail(headers)}
    return request


def _client_guardrail(headers: Mapping[str, str]) -> dict[str, str]:
    """The guardrail the client asked for itself (it only ever restricts the answer);
    never its trace (``aws_errors.NO_TRACE`` says why)."""
    sent = {name.lower(): value for name, value in headers.items()}
    if sent.get(TRACE_HEADER, "DISABLED").upper() != "DISABLED":
        raise invalid(NO_TRACE.format(where=f"{TRACE_HEADER} header"))
    found = {name.lower(): sent.get(name.lower(), "") for name in GUARDRAIL_HEADERS.values()}
    return {name: value for name, value in found.items() if value and len(value) <= 2048 and value.isprintable()}


def client_wants_usage(request: ParsedRequest) -> bool:
    """An Invoke stream always reports usage (Messages events and the invocation metrics)."""
    return True


# --- errors -----------------------------------------------------------------------

error_body = aws_errors.error_body
error_headers = aws_errors.error_headers
error_status = aws_errors.error_status
stream_error = aws_errors.stream_error


# --- egress -----------------------------------------------------------------------


def upstream_path(model: str, stream: bool) -> str:
    return model_path(model, STREAM_ACTION if stream else "invoke")


def upstream_headers(api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]:
    """JSON in, JSON out; the Bedrock provider signs. Of the client's headers only its own
    guardrail goes (its beta features are in the body already)."""
    guardrail = {name.lower() for name in GUARDRAIL_HEADERS.values()}
    return {"content-type": "application/json", "accept": "application/json", **{k: v for k, v in forward.items() if k in guardrail}}


# InvokeModel names its guardrail in headers, as boto3 sends ``guardrailIdentifier`` and the rest.
GUARDRAIL_HEADERS = {"identifier": "X-Amzn-Bedrock-GuardrailIdentifier", "version": "X-Amzn-Bedrock-GuardrailVersion"}
TRACE_HEADER = "x-amzn-bedrock-trace"
GUARDRAIL_CONFIG = "amazon-bedrock-guardrailConfig"  # a body member: tag suffix, streaming mode


def require_guardrail(body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes:
    """The policy's guardrail as InvokeModel's headers. A client's own never reaches them
    (the client's own is removed first, and so is the body's guardrail configuration,
    whose tag suffix or asynchronous mode would let the client narrow what it judges)."""
    for header in GUARDRAIL_HEADERS.values():
        headers.pop(header.lower(), None)
    if GUARDRAIL_CONFIG.encode() in body:
        document = json.loads(body)
        document.pop(GUARDRAIL_CONFIG, None)
        body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    for name, header in GUARDRAIL_HEADERS.items():
        value = guardrail.get(name)
        if value:
            headers[header] = value
    return body


def passthrough_body(request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes:
    """The client's own bytes (the model is in the path), with a larger max_tokens
    lowered to ``ceiling`` when the output must stay within it, and Bedrock's one
    ``anthropic_version``: SDKs send their own API version there (AnthropicBedrock 2.x
    sends its dated one), which Bedrock refuses."""
    raw = request.raw
    if request.body.get(envelope.VERSION_MEMBER) != envelope.VERSION:
        raw = set_member(raw, envelope.VERSION_MEMBER, envelope.VERSION)
    if ceiling is not None and (request.max_tokens or 0) > ceiling:
        raw = set_member(raw, "max_tokens", ceiling)
    return raw


def compose(model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]:
    """A one-turn request of the gateway's own (a classifier's); the model goes in the path."""
    body = messages.compose(model, instructions, user, max_tokens)
    del body["model"]
    return {envelope.VERSION_MEMBER: envelope.VERSION, **body}


def usage_of(document: Mapping[str, Any]) -> Usage | None:
    """The answer's usage, or Bedrock's invocation metrics when it reports none."""
    return messages.usage_of(document) or metrics_usage(document.get(METRICS))


def metrics_usage(metrics: Any) -> Usage | None:
    if not isinstance(metrics, Mapping) or not all(isinstance(metrics.get(k), int) for k in ("inputTokenCount", "outputTokenCount")):
        return None
    return Usage(
        input=metrics["inputTokenCount"],
        output=metrics["outputTokenCount"],
        cache_read=_count(metrics, "cacheReadInputTokenCount"),
        cache_write=_count(metrics, "cacheWriteInputTokenCount"),
    )


def _count(metrics: Mapping[str, Any], name: str) -> int:
    value = metrics.get(name)
    return value if isinstance(value, int) else 0


def is_error_event(event: SSEEvent) -> bool:
    """An exception frame, or a Messages ``error`` event inside a chunk."""
    return (isinstance(event, FramedEvent) and event.exception) or messages.is_error_event(event)


GUARDRAIL_ACTION = "amazon-bedrock-guardrailAction"  # what Bedrock adds when a guardrail judged the answer


def intervened(document: Mapping[str, Any]) -> bool:
    return document.get(GUARDRAIL_ACTION) == "INTERVENED"


class StreamUsage:
    """Usage read off the unwrapped Messages events, as a Messages stream is metered;
    when they did not report it, the invocation metrics Bedrock adds to the last chunk."""

    def __init__(self) -> None:
        self._events = messages.StreamUsage()
        self._metrics: Usage | None = None
        self.intervened = False

    @property
    def complete(self) -> bool:
        return self._events.complete

    @property
    def known(self) -> bool:
        return self._events.known or self._metrics is not None

    def feed(self, event: SSEEvent) -> None:
        self._events.feed(event)
        if GUARDRAIL_ACTION in event.data:
            with contextlib.suppress(ValueError, AttributeError):
                self.intervened = self.intervened or intervened(event.json())
        if event.event == "message_stop" and METRICS in event.data:
            try:
                self._metrics = metrics_usage(event.json().get(METRICS))
            except (ValueError, AttributeError):
                return

    @property
    def usage(self) -> Usage:
        if self._events.known or self._metrics is None:
            return self._events.usage
        return self._metrics
