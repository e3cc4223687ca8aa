"""Cache domains: a hosted provider's prompt cache belongs to one target. What
Anthropic direct cached for a conversation is not in Bedrock's cache, nor in another
Bedrock region's, so a conversation that moved once (its first target failed and the
next one served it) should stay where its cache now is.

This step remembers, per session (``Exchange.session_key``, the intent pin's too), the target
that served the conversation (``served:<session>`` in ``Store.sessions``: in process,
or in Redis for every replica) and on the next turn tries that target first, while
the plan still authorises it and its circuit breaker is closed; the others keep their
order after it. It only orders the targets the plan authorised, never adds one.

It writes only when the conversation moves: a conversation its first target serves
needs no memory, so the healthy path costs one read. ``ttl_seconds`` counts from the
last move. Configured by ``data.portcullis.cache_domains`` (absent: off).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.pipeline import Admission, Exchange, Step
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.session_state import SessionState
from portcullis.engine.breakers import target_id

log = logging.getLogger("portcullis.cache_domain")

DEFAULT_TTL_SECONDS = 3600


@dataclass(frozen=True)
class Pin:
    session: str  # the session key (a hash: no content)
    served: str | None  # the target that served the conversation's last turn, as remembered
    first: str  # the target tried first without a pin
    ttl_ms: int


def _settings(exchange: Exchange) -> dict[str, Any] | None:
    if exchange.bundle is None:
        return None
    data = (exchange.bundle.bundle.data.get("portcullis") or {}).get("cache_domains")
    if data is None or not data.get("pin", True):
        return None
    return data


class CacheDomainPin(Step[Pin]):
    layer = "routing"

    def __init__(self, sessions: SessionState) -> None:
        self._sessions = sessions

    async def admit(self, exchange: Exchange) -> Admission[Pin] | None:
        settings = _settings(exchange)
        if settings is None or not exchange.targets or exchange.principal is None or exchange.request is None:
            return None
        session = exchange.session_key()
        try:
            served = await self._sessions.get(f"served:{session}")
        except StoreUnavailable:
            log.warning("request %s: the conversation's target cannot be read: the store cannot be reached", exchange.request_id)
            served = None
        not_closed = exchange.facts.get("breakers") or {}
        first = next((t for t in exchange.targets if target_id(t) == served and target_id(t) not in not_closed), None)
        if first is not None and first != exchange.targets[0]:
            exchange.audit_started["cache_domain_pinned"] = target_id(first)
        ttl_ms = int(settings.get("ttl_seconds", DEFAULT_TTL_SECONDS)) * 1000
        return Admission(Pin(session, served, target_id(exchange.targets[0]), ttl_ms), first=first)

    async def settle(self, exchange: Exchange, state: Pin) -> None:
        if exchange.served is None:
            return
        served = target_id(exchange.served)
        if served == state.served or (state.served is None and served == state.first):
            return  # where it already was, or where it would go anyway
        try:
            await self._sessions.put(f"served:{state.session}", served, state.ttl_ms)
        except StoreUnavailable:
            log.warning("request %s: the conversation's target cannot be kept: the store cannot be reached", exchange.request_id)
