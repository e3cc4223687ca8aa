"""Bedrock Converse: the toolUse calls of an answer, found, denied in place and held in
a stream until each is whole.

A stream event's document is ``{"<eventType>": payload}``; the events the gateway
writes are named by their type, and the event-stream framing frames them again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols.bedrock_converse.surfaces import SERVER_TOOL_USE
from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import MAX_HELD_TOOL_CALL_BYTES, TOO_LARGE_TO_INSPECT, ToolCall, denial_text, tool_call


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


class ToolCallStream:
    """Holds each toolUse block's events, from its ``contentBlockStart`` to its
    ``contentBlockStop``, then releases them, or a text block in its place when the
    judge denies the call. When every call was denied, ``messageStop`` no longer asks
    for tools."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._index: Any = None
        self._name: Any = None
        self._parts: list[str] = []
        self._size = 0
        self._allowed = self._denied = 0
        self._dropping: Any = None  # a block denied before its end: its remaining events go

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._held:
            return self._holding(event)
        if event.event not in ("contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop"):
            return [event]
        payload = _payload(event)
        if self._dropping is not None and event.event != "messageStop" and payload.get("contentBlockIndex") == self._dropping:
            if event.event == "contentBlockStop":
                self._dropping = None
            return []
        start = payload.get("start") if event.event == "contentBlockStart" else None
        call = start.get("toolUse") if isinstance(start, dict) else None
        if isinstance(call, dict) and call.get("type") != SERVER_TOOL_USE:
            self._held, self._index, self._name = [event], payload.get("contentBlockIndex"), call.get("name")
            self._parts, self._size = [], 0
            return []
        if event.event == "messageStop" and self._denied and not self._allowed and payload.get("stopReason") == "tool_use":
            return [event_of({"messageStop": {**payload, "stopReason": "end_turn"}}, "messageStop")]
        return [event]

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a tool call: the call never completed, so it is
        denied; what came after it that is not part of the block still goes out."""
        if not self._held:
            return []
        held, index = self._held, self._index
        out = self._decide("the call did not complete")
        self._dropping = None
        rest = [e for e in held[1:] if e.event not in ("contentBlockDelta", "contentBlockStop") or _payload(e).get("contentBlockIndex") != index]
        return out + [released for e in rest for released in self.feed(e)]

    def _holding(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        payload = _payload(event) if event.event in ("contentBlockDelta", "contentBlockStop") else {}
        mine = payload.get("contentBlockIndex") == self._index
        if event.event == "contentBlockDelta" and mine:
            delta = payload.get("delta")
            piece = delta.get("toolUse") if isinstance(delta, dict) else None
            if isinstance(piece, dict) and isinstance(piece.get("input"), str):
                self._parts.append(piece["input"])
        if event.event != "contentBlockStop" or not mine:
            if self._size > MAX_HELD_TOOL_CALL_BYTES:
                return self._decide(TOO_LARGE_TO_INSPECT)
            return []
        return self._decide(None)

    def _decide(self, refused: str | None) -> list[SSEEvent]:
        held, self._held = self._held, []
        call = tool_call(self._name, "".join(self._parts))
        reason = refused or self._judge(call)
        if reason is None:
            self._allowed += 1
            return held
        self._denied += 1
        index = self._index
        if refused:  # decided before the block ended: the rest of it is dropped as it comes
            self._dropping = index
        # A text block has no start event in Converse: its first delta opens it.
        return [
            event_of({"contentBlockDelta": {"delta": {"text": denial_text(call, reason)}, "contentBlockIndex": index}}, "contentBlockDelta"),
            event_of({"contentBlockStop": {"contentBlockIndex": index}}, "contentBlockStop"),
        ]
