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

from typing import TYPE_CHECKING, Any

from portcullis.adapters.held_text import HeldTextGuard
from portcullis.adapters.pii.vault import Vault, VaultUnavailable
from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import StreamText
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pii.policy import SIGNED
from portcullis.engine.pii.redaction import is_token
from portcullis.engine.pii.restore import held_from, placeholders_in, restore, unescape_angles

if TYPE_CHECKING:
    from portcullis.adapters.pii.guard import PiiState

def withheld() -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM, "the answer refers to personal data this session cannot restore, so it was withheld", code="pii_restore_failed")


class Restorer(HeldTextGuard):
    def __init__(self, state: PiiState, vault: Vault, upstream: WireProtocol) -> None:
        super().__init__(upstream)
        self.state = state
        self.vault = vault

    def __repr__(self) -> str:
        return f"Restorer(restored={self.state.restored})"

    @property
    def _entities(self) -> frozenset[str]:
        return self.state.policy.reversible_entities

    # --- whole answers -------------------------------------------------------------------

    async def document(self, document: dict[str, Any]) -> bool:
        """Restores in place; True when it changed something."""
        seen: set[str] = set()

        def gather(surface: str, text: str) -> str:
            if surface != SIGNED:  # reasoning is never changed, so never restored
                seen.update(placeholders_in(text, self._entities))
            return text

        self.upstream.surfaces.visit_answer(document, gather)
        if not seen:
            return False
        resolved, keep = await self._resolve(seen)
        restored, missing = 0, False

        def put_back(surface: str, text: str) -> str:
            nonlocal restored, missing
            if surface == SIGNED:  # reasoning is never changed
                return text
            result = restore(text, resolved, self._entities, keep)
            restored += result.restored
            missing = missing or bool(result.missing)
            return result.text if result.restored else text

        self.upstream.surfaces.visit_answer(document, put_back)
        if missing:
            raise withheld()
        self.state.restored += restored
        return restored > 0

    # --- streams: only events that may hold a placeholder are looked into ---------------

    def _wants(self, event: SSEEvent) -> bool:
        return "<" in event.data or "u003c" in event.data  # "\\u003c": "<" as HTML-safe JSON writes it

    def _prepare(self, text: str, piece: StreamText) -> str:
        return unescape_angles(text) if piece.json else text

    def _cut(self, text: str, piece: StreamText) -> int:
        return held_from(text, piece.json)

    async def _rewrite(self, text: str, piece: StreamText) -> str:
        if "<" not in text:
            return text
        found = placeholders_in(text, self._entities)
        if not found:
            return text
        resolved, keep = await self._resolve(found)
        result = restore(text, resolved, self._entities, keep, json_string=piece.json)
        if result.missing:
            raise withheld()
        self.state.restored += result.restored
        return result.text

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
