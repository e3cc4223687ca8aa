"""Bedrock Runtime's event streams as the suites build and read them: the frames a
provider sends (Converse events, InvokeModel ``chunk`` frames), the events the gateway's
framings make of them, a stream converter run over those events, and the Messages
events an InvokeModel stream carries (a text answer, a tool call). Built with the
gateway's own codec, so the botocore parsers in ``botocore_bedrock`` judge them."""

from __future__ import annotations

import base64
import json
from typing import Any

from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING, INVOKE_FRAMING, event_frame
from portcullis.adapters.protocols.interfaces import StreamConverter
from portcullis.adapters.protocols.sse import SSEEvent

ANTHROPIC_EVENTS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_bdrk_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 4},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
]
# One tool call, ``read`` with {"path": "/tmp/a"}, its input in two pieces.
TOOL_USE_EVENTS: list[dict[str, Any]] = [
    ANTHROPIC_EVENTS[0],
    {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"path": "/tmp'}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '/a"}'}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
]


def frames(*events: tuple[str, dict[str, Any]]) -> bytes:
    """A provider's ConverseStream body: one event frame per (type, payload)."""
    return b"".join(event_frame(name, payload) for name, payload in events)


def converse_events(raw: list[bytes]) -> list[SSEEvent]:
    """Converse frames as the gateway's Converse framing delivers them to a converter."""
    parser = CONVERSE_FRAMING.Parser()
    return [*parser.feed(b"".join(raw)), *parser.close()]


def parsed(*events: tuple[str, dict[str, Any]]) -> list[SSEEvent]:
    """The frames of (type, payload) events as the gateway reads them."""
    return converse_events([frames(*events)])


def on_the_wire(events: list[SSEEvent]) -> bytes:
    return b"".join(CONVERSE_FRAMING.frame(event) for event in events)


def payloads(events: list[SSEEvent]) -> list[tuple[str | None, Any]]:
    """Each event's type and payload, from its document."""
    return [(event.event, json.loads(event.data)[event.event]) for event in events]


def chunk_frames(events: list[dict[str, Any]]) -> list[bytes]:
    """Each event in a ``chunk`` frame, as Bedrock's InvokeModelWithResponseStream sends it."""
    return [event_frame("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()}) for event in events]


def unwrapped(events: list[dict[str, Any]]) -> list[SSEEvent]:
    """Those chunk frames as the gateway's Invoke framing delivers them (the Messages events)."""
    parser = INVOKE_FRAMING.Parser()
    return [event for frame in chunk_frames(events) for event in parser.feed(frame)] + parser.close()


def converted(converter: StreamConverter, events: list[SSEEvent]) -> bytes:
    """What a stream converter writes for ``events``, its closing output included."""
    return b"".join(b"".join(converter.feed(event)) for event in events) + b"".join(converter.finish())
