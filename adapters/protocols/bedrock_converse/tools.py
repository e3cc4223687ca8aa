"""Bedrock Converse: the toolUse calls of an answer, found, denied in place and held in
a stream until each is whole.

A stream event's document is ``{"<eventType>": payload}``; the events the gateway
writes are named by their type, and the event-stream framing frames them again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.bedrock_converse.surfaces import SERVER_TOOL_USE
from portcullis.adapters.protocols.held_tool_blocks import HeldToolBlocks
from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import ToolCall, tool_call


def _content(document: Mapping[str, Any]) -> list[Any]:
    output = document.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _client_call(block: Any) -> dict[str, Any] | None:
    """A toolUse the client runs (a server tool already ran at the provider)."""
    call = block.get("toolUse") if isinstance(block, dict) else None
    return call if isinstance(call, dict) and call.get("type") != SERVER_TOOL_USE else None


def answer_tool_calls(document: Mapping[str, Any]) -> list[tuple[int, ToolCall]]:
    """The client-executed tool calls of an answer, by content position."""
    return [(i, tool_call(call.get("name"), call.get("input"))) for i, block in enumerate(_content(document)) if (call := _client_call(block)) is not None]


def deny_tool_calls(document: dict[str, Any], denials: Mapping[int, str]) -> None:
    """Denied calls become text blocks; an answer left without a call ends its turn."""
    content = _content(document)
    for position, text in denials.items():
        content[position] = {"text": text}
    if document.get("stopReason") == "tool_use" and not any(_client_call(block) is not None for block in content):
        document["stopReason"] = "end_turn"


def _payload(event: SSEEvent) -> dict[str, Any]:
    try:
        document = event.json()
    except ValueError:
        return {}
    payload = document.get(event.event or "") if isinstance(document, dict) else None
    return payload if isinstance(payload, dict) else {}


class ToolCallStream(HeldToolBlocks):
    """Holds each toolUse block's events, from its ``contentBlockStart`` to its
    ``contentBlockStop``, then releases them, or a text block in its place when the
    judge denies the call. When every call was denied, ``messageStop`` no longer asks
    for tools."""

    DELTA = "contentBlockDelta"
    STOP = "contentBlockStop"

    def _passes(self, event: SSEEvent) -> bool:
        return event.event not in ("contentBlockStart", self.DELTA, self.STOP, "messageStop")

    def _block_index(self, event: SSEEvent) -> Any:
        return _payload(event).get("contentBlockIndex") if event.event in ("contentBlockStart", self.DELTA, self.STOP) else None

    def _call_start(self, event: SSEEvent) -> tuple[Any, Any, Any] | None:
        if event.event != "contentBlockStart":
            return None
        payload = _payload(event)
        start = payload.get("start")
        call = start.get("toolUse") if isinstance(start, dict) else None
        if isinstance(call, dict) and call.get("type") != SERVER_TOOL_USE:
            return payload.get("contentBlockIndex"), call.get("name"), ""  # the input comes in deltas only
        return None

    def _input_piece(self, event: SSEEvent) -> str | None:
        if event.event != self.DELTA or self._block_index(event) != self._index:
            return None
        delta = _payload(event).get("delta")
        piece = delta.get("toolUse") if isinstance(delta, dict) else None
        return piece["input"] if isinstance(piece, dict) and isinstance(piece.get("input"), str) else None

    def _without_tool_use(self, event: SSEEvent) -> SSEEvent | None:
        payload = _payload(event) if event.event == "messageStop" else {}
        if payload.get("stopReason") != "tool_use":
            return None
        return event_of({"messageStop": {**payload, "stopReason": "end_turn"}}, "messageStop")

    def _text_block(self, index: Any, text: str) -> list[SSEEvent]:
        # A text block has no start event in Converse: its first delta opens it.
        return [
            event_of({"contentBlockDelta": {"delta": {"text": text}, "contentBlockIndex": index}}, "contentBlockDelta"),
            event_of({"contentBlockStop": {"contentBlockIndex": index}}, "contentBlockStop"),
        ]
