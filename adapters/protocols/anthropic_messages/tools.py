"""Anthropic Messages: the tool_use calls of an answer, found, denied in place and held
in a stream until each is whole."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.held_tool_blocks import HeldToolBlocks
from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import ToolCall, tool_call


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


class ToolCallStream(HeldToolBlocks):
    """Holds each tool_use block's events until its content_block_stop, then releases
    them, or a text block in its place when the judge denies the call. When every call
    was denied, ``message_delta`` no longer asks for tools."""

    DELTA = "content_block_delta"
    STOP = "content_block_stop"

    def _block_index(self, event: SSEEvent) -> Any:
        return event.json().get("index") if event.event in (self.DELTA, self.STOP) else None

    def _call_start(self, event: SSEEvent) -> tuple[Any, Any, Any] | None:
        if event.event != "content_block_start":
            return None
        document = event.json()
        block = document.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            return document.get("index"), block.get("name"), block.get("input")
        return None

    def _input_piece(self, event: SSEEvent) -> str | None:
        if event.event != self.DELTA:
            return None
        delta = event.json().get("delta") or {}
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            return delta["partial_json"]
        return None

    def _without_tool_use(self, event: SSEEvent) -> SSEEvent | None:
        if event.event != "message_delta":
            return None
        document = event.json()
        delta = document.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
            delta["stop_reason"] = "end_turn"
            return event_of(document, event.event)
        return None

    def _text_block(self, index: Any, text: str) -> list[SSEEvent]:
        return [
            event_of({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"),
            event_of({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}, "content_block_delta"),
            event_of({"type": "content_block_stop", "index": index}, "content_block_stop"),
        ]
