"""The stream mechanics of answer guards that rewrite text in flight (placeholder
restore, the output guard).

Each text delta is rewritten as it passes, except a tail the guard cannot judge yet
(the start of a placeholder, of a URL, of a secret): that tail is taken out of its
event and put in front of the next delta of the same channel (content block, tool
call, choice). The event it came from waits until the tail is resolved, and events
behind it wait too, so order never changes. When a channel ends its tail is judged
as it is and goes back where it came from. Only events whose text ends in such a
tail are delayed; past ``MAX_WAITING_EVENTS`` every tail is let go.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import ALL_CHANNELS, StreamText

MAX_WAITING_EVENTS = 256


@dataclass
class _Waiting:
    event: SSEEvent = field(repr=False)  # reprs must never carry answer text
    document: Any = field(default=None, repr=False)
    changed: bool = False
    tails: int = 0  # held tails this event's text gave up

    def release(self) -> SSEEvent:
        return event_of(self.document, self.event.event) if self.changed else self.event


@dataclass
class _Tail:
    owner: _Waiting
    piece: StreamText = field(repr=False)
    text: str = field(repr=False)


class HeldTextGuard:
    """Subclasses say which events to look into, where a text must be cut, and how a
    judged piece of text is rewritten. Signed pieces (reasoning) reach only guards that
    read them, and ``_rewrite`` must return their text unchanged."""

    reads_signed = False

    def __init__(self, upstream: WireProtocol) -> None:
        self.upstream = upstream  # the provider's protocol: guards see answers before conversion
        self._queue: list[_Waiting] = []
        self._tails: dict[Any, _Tail] = {}

    # --- hooks ---------------------------------------------------------------------------

    def _wants(self, event: SSEEvent) -> bool:
        return True

    def _prepare(self, text: str, piece: StreamText) -> str:
        return text

    def _cut(self, text: str, piece: StreamText) -> int:
        return len(text)

    async def _rewrite(self, text: str, piece: StreamText) -> str:
        return text

    # --- mechanics -----------------------------------------------------------------------

    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        for event in events:
            waiting = _Waiting(event)
            if self._tails or self._wants(event):
                await self._look_into(waiting)
            self._queue.append(waiting)
            if len(self._queue) > MAX_WAITING_EVENTS:
                await self._close(ALL_CHANNELS)
            out.extend(self._release())
        return out

    async def finish(self) -> list[SSEEvent]:
        await self._close(ALL_CHANNELS)
        return self._release()

    async def _look_into(self, waiting: _Waiting) -> None:
        if waiting.event.data == "[DONE]":
            await self._close(ALL_CHANNELS)
            return
        try:
            document = waiting.event.json()
        except ValueError:
            return
        if not isinstance(document, dict):
            return
        waiting.document = document
        for piece in self.upstream.surfaces.stream_texts(document):
            if self.reads_signed or not piece.signed:
                await self._piece(waiting, piece)
        for ended in self.upstream.surfaces.stream_ends(document):
            await self._close(ended)

    async def _piece(self, waiting: _Waiting, piece: StreamText) -> None:
        original = piece.holder[piece.key]
        tail = self._tails.pop(piece.channel, None)
        text = original
        if tail is not None:
            tail.owner.tails -= 1
            text = tail.text + text
        text = self._prepare(text, piece)
        cut = self._cut(text, piece)
        head, rest = text[:cut], text[cut:]
        head = await self._rewrite(head, piece)
        if rest:
            self._tails[piece.channel] = _Tail(waiting, piece, rest)
            waiting.tails += 1
        if head != original:
            piece.holder[piece.key] = head
            waiting.changed = True

    async def _close(self, ended: Any) -> None:
        """A channel (or every channel of a choice) ended: its held tail is complete as
        it is, judged, and goes back where it came from."""
        for key in [c for c in self._tails if ended == ALL_CHANNELS or c == ended or (isinstance(c, tuple) and c[0] == ended)]:
            tail = self._tails.pop(key)
            tail.piece.holder[tail.piece.key] += await self._rewrite(tail.text, tail.piece)
            tail.owner.changed = True
            tail.owner.tails -= 1

    def _release(self) -> list[SSEEvent]:
        out = []
        while self._queue and self._queue[0].tails == 0:
            out.append(self._queue.pop(0).release())
        return out
