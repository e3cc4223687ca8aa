"""A stream's tool calls held block by block, for the protocols whose streams carry a
call as one content block from its start event to its stop event (Anthropic Messages,
and so InvokeModel; Bedrock Converse). Each call is judged once it is whole, then its
events are released or a text block saying why takes its place; a call that grows
past ``MAX_HELD_TOOL_CALL_BYTES``, or that the stream ends inside, is denied there.

The holding, judging and dropping are the same for every such protocol, so they are
written once here; a protocol's subclass says only how its events name a block, start
a call, carry its input, write a text block and end a turn that asked for tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import MAX_HELD_TOOL_CALL_BYTES, TOO_LARGE_TO_INSPECT, ToolCall, denial_text, tool_call


class HeldToolBlocks:
    """Holds each client tool call's block, from its start event to its stop event."""

    DELTA: ClassVar[str]  # the protocol's block delta event
    STOP: ClassVar[str]  # and its block stop event

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._index: Any = None
        self._name: Any = None
        self._given: Any = None  # the input the start event gave, for a call that streams none
        self._parts: list[str] = []
        self._size = 0
        self._allowed = self._denied = 0
        self._dropping: Any = None  # a block denied before its end: its remaining events go

    # --- what a protocol says -------------------------------------------------------

    def _passes(self, event: SSEEvent) -> bool:
        """An event that is never a tool call's and never changes (left unread)."""
        return False

    def _block_index(self, event: SSEEvent) -> Any:
        """The index of the block an event belongs to (None: the event is no block's)."""
        raise NotImplementedError

    def _call_start(self, event: SSEEvent) -> tuple[Any, Any, Any] | None:
        """(index, tool name, input given at the start) when the event starts a client tool call."""
        raise NotImplementedError

    def _input_piece(self, event: SSEEvent) -> str | None:
        """The piece of the held call's input a held event carries."""
        raise NotImplementedError

    def _without_tool_use(self, event: SSEEvent) -> SSEEvent | None:
        """The event that ends the turn, rewritten not to ask for tools (every call was
        denied); None when this event is not it."""
        raise NotImplementedError

    def _text_block(self, index: Any, text: str) -> list[SSEEvent]:
        """A text block at ``index``, in the place of a denied call."""
        raise NotImplementedError

    # --- the holding ------------------------------------------------------------------

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._held:
            return self._holding(event)
        if self._passes(event):
            return [event]
        if self._dropping is not None and self._block_index(event) == self._dropping:
            if event.event == self.STOP:
                self._dropping = None
            return []
        start = self._call_start(event)
        if start is not None:
            self._held = [event]
            self._index, self._name, self._given = start
            self._parts, self._size = [], 0
            return []
        if self._denied and not self._allowed:
            rewritten = self._without_tool_use(event)
            if rewritten is not None:
                return [rewritten]
        return [event]

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a tool call: the call never completed, so it is
        denied; what came after it that is not part of the block still goes out."""
        if not self._held:
            return []
        held, index = self._held, self._index
        out = self._decide("the call did not complete")
        self._dropping = None
        rest = [e for e in held[1:] if e.event not in (self.DELTA, self.STOP) or self._block_index(e) != index]
        return out + [released for e in rest for released in self.feed(e)]

    def _holding(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        piece = self._input_piece(event)
        if piece is not None:
            self._parts.append(piece)
        if event.event != self.STOP or self._block_index(event) != self._index:
            if self._size > MAX_HELD_TOOL_CALL_BYTES:
                return self._decide(TOO_LARGE_TO_INSPECT)
            return []
        return self._decide(None)

    def _decide(self, refused: str | None) -> list[SSEEvent]:
        held, self._held = self._held, []
        call = tool_call(self._name, "".join(self._parts) if self._parts else self._given)
        reason = refused or self._judge(call)
        if reason is None:
            self._allowed += 1
            return held
        self._denied += 1
        if refused:  # decided before the block ended: the rest of it is dropped as it comes
            self._dropping = self._index
        return self._text_block(self._index, denial_text(call, reason))
