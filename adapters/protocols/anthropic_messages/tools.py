"""Anthropic Messages: the tool_use calls of an answer, found, denied in place and held
in a stream until each is whole."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import MAX_HELD_TOOL_CALL_BYTES, TOO_LARGE_TO_INSPECT, ToolCall, denial_text, tool_call


def answer_tool_calls(document: Mapping[str, Any]) -> list[tuple[int, ToolCall]]:
    """The client-executed tool calls of an answer, by content position. Server tools
    run at the provider before the gateway sees them, so they are not the guard's."""
    return [
        (i, tool_call(block.get("name"), block.get("input")))
        for i, block in enumerate(document.get("content") or ())
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


def deny_tool_calls(document: dict[str, Any], denials: Mapping[int, str]) -> None:
    """Denied calls become text blocks; an answer left without a call ends its turn."""
    content = document["content"]
    for position, text in denials.items():
        content[position] = {"type": "text", "text": text}
    if document.get("stop_reason") == "tool_use" and not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        document["stop_reason"] = "end_turn"


class ToolCallStream:
    """Holds each tool_use block's events until its content_block_stop, then releases
    them, or a text block in its place when the judge denies the call."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._index: Any = None
        self._start: dict[str, Any] = {}
        self._parts: list[str] = []
        self._size = 0
        self._allowed = self._denied = 0
        self._dropping: Any = None  # a block denied before its end: its remaining events go

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._held:
            return self._holding(event)
        if self._dropping is not None and event.event in ("content_block_delta", "content_block_stop") and event.json().get("index") == self._dropping:
            if event.event == "content_block_stop":
                self._dropping = None
            return []
        if event.event == "content_block_start":
            document = event.json()
            block = document.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self._held, self._index, self._start = [event], document.get("index"), block
                self._parts, self._size = [], 0
                return []
        elif event.event == "message_delta" and self._denied and not self._allowed:
            document = event.json()
            delta = document.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                delta["stop_reason"] = "end_turn"
                return [event_of(document, event.event)]
        return [event]

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a tool call: the call never completed, so it is
        denied; what came after it that is not part of the block still goes out."""
        if not self._held:
            return []
        held, index = self._held, self._index
        out = self._decide("the call did not complete")
        self._dropping = None
        rest = [e for e in held[1:] if e.event not in ("content_block_delta", "content_block_stop") or e.json().get("index") != index]
        return out + [out_event for e in rest for out_event in self.feed(e)]

    def _holding(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        if event.event == "content_block_delta":
            delta = event.json().get("delta") or {}
            if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self._parts.append(delta["partial_json"])
        if event.event != "content_block_stop" or event.json().get("index") != self._index:
            if self._size > MAX_HELD_TOOL_CALL_BYTES:
                return self._decide(TOO_LARGE_TO_INSPECT)
            return []
        return self._decide(None)

    def _decide(self, refused: str | None) -> list[SSEEvent]:
        held, self._held = self._held, []
        arguments = "".join(self._parts) if self._parts else self._start.get("input")
        call = tool_call(self._start.get("name"), arguments)
        reason = refused or self._judge(call)
        if reason is None:
            self._allowed += 1
            return held
        self._denied += 1
        text = denial_text(call, reason)
        index = self._index
        if refused:  # decided before the block ended: the rest of it is dropped as it comes
            self._dropping = index
        return [
            event_of({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
            event_of({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}, "content_block_delta"),
            event_of({"type": "content_block_stop", "index": index}, "content_block_stop"),
        ]
