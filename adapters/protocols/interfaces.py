"""What a wire protocol is to the rest of the gateway, declared.

A protocol is a package (``anthropic_messages/``, ``openai_chat/``, ...) of three
modules, each satisfying one interface below: ``wire`` (parse what a client sends,
render errors, prepare the upstream request, read usage and stream events),
``surfaces`` (every string the provider reads or writes, for the filters and guards
that inspect and transform text) and ``tools`` (the model's tool calls, held and
judged). Modules satisfy ``typing.Protocol``s as well as classes do; the registry
checks each package against these interfaces when it loads.

Steps and guards see only these interfaces, never a protocol's name or constants:
adding a protocol is one package, its translator pairs and a registry entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from portcullis.adapters.operations import Operation

if TYPE_CHECKING:
    from portcullis.adapters.config import RequestLimits
    from portcullis.adapters.protocols.request import ParsedRequest
    from portcullis.adapters.protocols.sse import SSEEvent
    from portcullis.adapters.protocols.text import StreamText, TextVisitor, ToolCall
    from portcullis.engine.conversation import Conversation
    from portcullis.engine.errors import GatewayError
    from portcullis.engine.integrity.spotlight import Boundary
    from portcullis.engine.plan import Target
    from portcullis.engine.pricing import Usage


class StreamParser(Protocol):
    """A provider's stream bytes in, its events out (``SSEError`` when malformed)."""

    def feed(self, chunk: bytes) -> list[SSEEvent]: ...
    def close(self) -> list[SSEEvent]: ...


class Framing(Protocol):
    """How a protocol's stream is framed on the wire: server-sent events, or the AWS
    event stream. Events are framing-neutral (``SSEEvent``: a name and JSON data), so
    meters, guards and converters read every protocol's events one way."""

    CONTENT_TYPE: str  # of a streamed response in this protocol
    Parser: Callable[[], StreamParser]

    def frame(self, event: SSEEvent) -> bytes: ...  # an event's bytes on this framing


class StreamMeter(Protocol):
    """Usage read off a provider's stream as it passes. ``complete``: the stream ended
    properly; ``known``: it reported final usage."""

    complete: bool
    known: bool
    intervened: bool  # the provider's own guard (a Bedrock guardrail) intervened in the answer

    def feed(self, event: SSEEvent) -> None: ...
    @property
    def usage(self) -> Usage: ...


class StreamConverter(Protocol):
    """Turns the provider's events into the bytes the client's protocol expects."""

    def feed(self, event: SSEEvent) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...


class ToolCallStream(Protocol):
    """Holds a streamed tool call until it is complete, then releases it or its denial."""

    def feed(self, event: SSEEvent) -> list[SSEEvent]: ...
    def finish(self) -> list[SSEEvent]: ...


@runtime_checkable
class Wire(Protocol):
    """The protocol on the wire, as ingress (client side) and as egress (provider side)."""

    NAME: str
    TOKEN_COUNT_EXACT: bool  # its providers count input as tiktoken does (else an upper bound is used)
    FRAMING: Framing  # of its streams, both ways

    # ingress; ``path``: the route's path parameters (Bedrock names the model and the operation there)
    def parse(self, raw: bytes, headers: Mapping[str, str], query: str, limits: RequestLimits, path: Mapping[str, str]) -> ParsedRequest: ...
    def error_body(self, error: GatewayError, request_id: str) -> bytes: ...
    def error_headers(self, error: GatewayError, request_id: str) -> dict[str, str]: ...  # a refusal's own headers, beyond the gateway's
    def error_status(self, error: GatewayError) -> int: ...  # a refusal's HTTP status in this protocol
    def stream_error(self, error: GatewayError) -> bytes: ...
    def client_wants_usage(self, request: ParsedRequest) -> bool: ...

    # egress
    def upstream_path(self, model: str, stream: bool) -> str: ...  # appended to a provider's base_url
    def upstream_headers(self, api_key: str | None, forward: Mapping[str, str]) -> dict[str, str]: ...
    # The guardrail the policy requires, added so the client cannot remove or change it
    # (``identifier``, ``version``, ``trace``); a protocol whose providers have none returns the body.
    def require_guardrail(self, body: bytes, headers: dict[str, str], guardrail: Mapping[str, str]) -> bytes: ...
    def passthrough_body(self, request: ParsedRequest, upstream_model: str, ceiling: int | None) -> bytes: ...
    def cap_output(self, body: dict[str, Any], ceiling: int) -> None: ...
    def compose(self, model: str, instructions: str, user: str, max_tokens: int) -> dict[str, Any]: ...
    def answer_text(self, document: Mapping[str, Any]) -> str: ...
    def usage_of(self, document: Mapping[str, Any]) -> Usage | None: ...
    def is_error_event(self, event: SSEEvent) -> bool: ...
    def is_usage_only(self, document: Mapping[str, Any]) -> bool: ...
    def intervened(self, document: Mapping[str, Any]) -> bool: ...  # a provider guard intervened in this answer
    StreamUsage: Callable[[], StreamMeter]


Parse = Callable[[bytes, "Mapping[str, str]", str, "RequestLimits", "Mapping[str, str]"], "ParsedRequest"]


@runtime_checkable
class TokenCounting(Protocol):
    """A protocol's token-count endpoint (optional): the body is a request of the
    protocol without an output limit; the provider answers the input's size."""

    PATH: str  # the count endpoint, appended to a provider's base_url as ``Wire.upstream_path`` is

    def parse(self, raw: bytes, headers: Mapping[str, str], query: str, limits: RequestLimits, path: Mapping[str, str]) -> ParsedRequest: ...
    def estimate_body(self, tokens: int) -> bytes: ...  # a locally counted answer, in the provider's shape


@runtime_checkable
class Surfaces(Protocol):
    """Every string of a request the provider reads, and of an answer it writes, each
    tagged with its surface; and the places the gateway adds its own text."""

    def visit_prompt(self, body: dict[str, Any], visit: TextVisitor) -> list[str]: ...
    def visit_answer(self, document: dict[str, Any], visit: TextVisitor) -> None: ...
    def stream_texts(self, event: Mapping[str, Any]) -> list[StreamText]: ...
    def provider_run_block(self, event: Mapping[str, Any]) -> Any: ...
    def stream_ends(self, event: Mapping[str, Any]) -> list[Any]: ...
    def insert_system_prompt(self, body: dict[str, Any], text: str) -> None: ...
    def leading_instructions(self, body: Mapping[str, Any]) -> str | None: ...
    def spotlight(self, body: dict[str, Any], boundary: Boundary, sources: frozenset[str]) -> int: ...
    def conversation(self, body: Mapping[str, Any]) -> Conversation: ...  # what routing reads of it


@runtime_checkable
class ToolCalls(Protocol):
    """The tool calls of an answer: found, denied in place, and held in a stream."""

    def answer_tool_calls(self, document: Mapping[str, Any]) -> list[tuple[Any, ToolCall]]: ...
    def deny_tool_calls(self, document: dict[str, Any], denials: Mapping[Any, str]) -> None: ...
    ToolCallStream: Callable[[Callable[[ToolCall], str | None]], ToolCallStream]


@runtime_checkable
class Translator(Protocol):
    """One (client protocol, provider protocol) pair: a pure conversion both ways."""

    TARGET: str  # the provider side, as error messages name it
    # ``stream``: the client asked for a stream (Bedrock clients say so in the path, not the body)
    def convert_request(self, body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]: ...
    def convert_response(self, document: Mapping[str, Any], created: int) -> dict[str, Any]: ...
    StreamConverter: Callable[[bool, int], StreamConverter]


@dataclass(frozen=True)
class WireProtocol:
    """One protocol as the registry holds it."""

    name: str
    wire: Wire
    surfaces: Surfaces
    tools: ToolCalls
    counting: TokenCounting | None = None  # its token-count endpoint, if it has one

    def parser(self, operation: Operation) -> Parse:
        """How a body of ``operation`` is read; a LookupError when the protocol has none."""
        if operation == Operation.INFERENCE:
            return self.wire.parse
        if operation == Operation.COUNT_TOKENS and self.counting is not None:
            return self.counting.parse
        raise LookupError(f"{self.name} has no {operation} operation")
