"""Stage 8 for pseudonyms and tokens: the answer's placeholders become values again.

Placeholders this request assigned are restored from memory; others (a session's
earlier turns, a team's tokens) are looked up in the vault. A pseudonym nobody can
restore withholds the answer (fail closed): the vault lost it, or it was never this
principal's. Tokens are restored only for principals the policy names as readers;
for everyone else they stay tokens. Signed reasoning (thinking) is never touched.

In a stream, the tail of a text delta that could be the start of a placeholder is
held back: the event carrying it waits until the next delta of the same content
block completes or rules out the placeholder, and events behind it wait in order.
Only that event is delayed, and only when its text ends in ``<`` and capitals.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from portcullis.adapters.pii.vault import Vault, VaultUnavailable
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.adapters.protocols.text import ALL_CHANNELS, StreamText
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pii.redaction import is_token
from portcullis.engine.pii.restore import held_from, placeholders_in, restore, unescape_angles

if TYPE_CHECKING:
    from portcullis.adapters.pii.guard import PiiState

MAX_WAITING_EVENTS = 256  # past this a held tail is released as plain text


def withheld() -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM, "the answer refers to personal data this session cannot restore, so it was withheld", code="pii_restore_failed")


@dataclass
class _Waiting:
    event: SSEEvent = field(repr=False)  # reprs must never carry answer text or values
    document: Any = field(default=None, repr=False)
    changed: bool = False
    tails: int = 0  # held tails this event's text gave up

    def release(self) -> SSEEvent:
        if not self.changed:
            return self.event
        data = json.dumps(self.document, ensure_ascii=False, separators=(",", ":"))
        return SSEEvent(self.event.event, data, encode(data, self.event.event))


@dataclass
class _Tail:
    owner: _Waiting
    piece: StreamText = field(repr=False)
    text: str = field(repr=False)


@dataclass
class Restorer:
    state: PiiState
    vault: Vault = field(repr=False)
    upstream: ModuleType = field(repr=False)  # the provider's protocol: guards see answers before conversion
    _queue: list[_Waiting] = field(default_factory=list, repr=False)
    _tails: dict[Any, _Tail] = field(default_factory=dict, repr=False)

    @property
    def _entities(self) -> frozenset[str]:
        return self.state.policy.reversible_entities

    # --- whole answers -------------------------------------------------------------------

    async def document(self, document: dict[str, Any]) -> bool:
        """Restores in place; True when it changed something."""
        seen: set[str] = set()
        self.upstream.visit_answer(document, lambda surface, text: seen.update(placeholders_in(text, self._entities)) or text)
        if not seen:
            return False
        resolved, keep = await self._resolve(seen)
        restored, missing = 0, False

        def put_back(surface: str, text: str) -> str:
            nonlocal restored, missing
            result = restore(text, resolved, self._entities, keep)
            restored += result.restored
            missing = missing or bool(result.missing)
            return result.text if result.restored else text

        self.upstream.visit_answer(document, put_back)
        if missing:
            raise withheld()
        self.state.restored += restored
        return restored > 0

    # --- streams -------------------------------------------------------------------------

    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        for event in events:
            waiting = _Waiting(event)
            if self._tails or "<" in event.data or "u003c" in event.data:  # "\u003c": "<" as HTML-safe JSON writes it
                await self._restore_event(waiting)
            self._queue.append(waiting)
            if len(self._queue) > MAX_WAITING_EVENTS:
                self._close(ALL_CHANNELS)
            out.extend(self._release())
        return out

    async def finish(self) -> list[SSEEvent]:
        self._close(ALL_CHANNELS)
        return self._release()

    async def _restore_event(self, waiting: _Waiting) -> None:
        if waiting.event.data == "[DONE]":
            self._close(ALL_CHANNELS)
            return
        try:
            document = waiting.event.json()
        except ValueError:
            return
        if not isinstance(document, dict):
            return
        waiting.document = document
        for piece in self.upstream.stream_texts(document):
            await self._restore_piece(waiting, piece)
        for ended in self.upstream.stream_ends(document):
            self._close(ended)

    async def _restore_piece(self, waiting: _Waiting, piece: StreamText) -> None:
        original = piece.holder[piece.key]
        tail = self._tails.pop(piece.channel, None)
        text = original
        if tail is not None:
            tail.owner.tails -= 1
            text = tail.text + text
        if piece.json:
            text = unescape_angles(text)
        cut = held_from(text, piece.json)
        head, rest = text[:cut], text[cut:]
        if "<" in head:
            found = placeholders_in(head, self._entities)
            resolved, keep = await self._resolve(found) if found else ({}, set())
            result = restore(head, resolved, self._entities, keep, json_string=piece.json)
            if result.missing:
                raise withheld()
            self.state.restored += result.restored
            head = result.text
        if rest:
            self._tails[piece.channel] = _Tail(waiting, piece, rest)
            waiting.tails += 1
        if head != original:
            piece.holder[piece.key] = head
            waiting.changed = True

    def _close(self, ended: Any) -> None:
        """A channel (or every channel of a choice) ended: a held tail was no
        placeholder after all; it goes back where it came from."""
        for key in [c for c in self._tails if ended == ALL_CHANNELS or c == ended or (isinstance(c, tuple) and c[0] == ended)]:
            tail = self._tails.pop(key)
            tail.piece.holder[tail.piece.key] += tail.text
            tail.owner.changed = True
            tail.owner.tails -= 1

    def _release(self) -> list[SSEEvent]:
        out = []
        while self._queue and self._queue[0].tails == 0:
            out.append(self._queue.pop(0).release())
        return out

    # --- lookups -------------------------------------------------------------------------

    async def _resolve(self, placeholders: set[str]) -> tuple[dict[str, str], set[str]]:
        """Values for what this principal may see; the tokens it sees as tokens. A token
        this very request assigned is still only revealed to a reader."""
        known = self.state.restore
        tokens = {p for p in placeholders if is_token(p)}
        if not self.state.policy.restore_tokens:
            placeholders, keep = placeholders - tokens, tokens
        else:
            keep = set()
        resolved = {p: known[p] for p in placeholders if p in known}
        unknown = [p for p in placeholders if p not in known]
        try:
            if any(is_token(p) for p in unknown) and self.state.token_scope:
                resolved.update(await self.vault.reveal(self.state.token_scope, [p for p in unknown if is_token(p)]))
            if any(not is_token(p) for p in unknown) and self.state.session_scope:
                resolved.update(await self.vault.reveal(self.state.session_scope, [p for p in unknown if not is_token(p)]))
        except VaultUnavailable:
            raise withheld() from None
        return resolved, keep
