"""What a test scripts the fake provider to do, and what the fake records.

These are format-neutral: every wire format module answers a ``Reply`` in its own
bodies and events, and fails, hangs or cuts a stream the same way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:20]}")
    raw: str | None = None  # a custom (free-form) tool's input, where the format has them (Responses)


@dataclass(frozen=True)
class Reply:
    """A successful answer. Usage is fixed so tests can compute exact costs."""

    text: str = "Hello from the fake provider."
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 100
    output_tokens: int = 20
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    delay: float = 0.0  # before the response starts
    event_delay: float = 0.0  # between stream events
    reports_usage: bool = True  # some OpenAI-compatible servers send no usage at all
    pieces: int = 3  # deltas each streamed text or tool input is split into
    echo: bool = False  # answer with the last user message's text, as the provider received it
    reasoning: str | None = None  # a reasoning summary, where the format streams one (Responses, with encrypted content)


@dataclass(frozen=True)
class Fail:
    """An error response, before anything is streamed."""

    status: int = 529
    retry_after: int | None = None


@dataclass(frozen=True)
class Hang:
    """Accept the connection and say nothing for ``seconds``."""

    seconds: float = 30.0


@dataclass(frozen=True)
class CutStream:
    """Stream ``after`` events of a normal reply, then drop the connection."""

    after: int = 3


@dataclass(frozen=True)
class StreamError:
    """Stream ``after`` events, then send the protocol's error event and stop."""

    after: int = 0
    error_type: str = "overloaded_error"


@dataclass(frozen=True)
class Redirect:
    """Answer 307 to another location (a misconfigured or hostile upstream)."""

    location: str


@dataclass(frozen=True)
class Intervene:
    """A Bedrock guardrail blocks the exchange and answers its own message instead of the
    model's; only when the request names a guardrail (otherwise a normal reply)."""

    message: str = "Sorry, the model cannot answer this question."


Behaviour = Reply | Fail | Hang | CutStream | StreamError | Redirect | Intervene


@dataclass
class Received:
    path: str  # as it arrived: Bedrock's still percent-encoded
    headers: dict[str, str]
    body: bytes
    model: str | None = None  # where the path names it (Bedrock), decoded; else the body's

    @property
    def json(self) -> Any:
        return json.loads(self.body)
