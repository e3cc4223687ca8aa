"""``input.facts.session``: the tier a conversation was pinned to, so it never changes
model mid-way, and the pin itself once a plan decides a new one.

The tier is decided on a session's first turn and stored in ``Store.sessions`` under
``tier:<session>`` for the bundle's ``pin_ttl_seconds``, first write winning: two
replicas deciding the same first turn at once agree on one value from then on. A
conversation is the client's session id when it sends one (``x-portcullis-session-id``,
Claude Code's ``x-claude-code-session-id``), else the hash of its stable prefix (team,
tools, first system text, first message), always scoped to the principal.

A later turn that finds no pin (it expired, or the in-process store restarted) gets its
tier decided again from the same features, and pinned from then on: the task's text is
the first user message's, the same on every turn, so the tier is usually the one it had.
A store that cannot be reached loses nothing but the pin: the tier is computed each turn.
"""

from __future__ import annotations

import logging
from typing import Any

from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.pipeline import Exchange, FactSource
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.session_state import SessionState

log = logging.getLogger("portcullis.intent")

LAYER = "intent"


def pin_key(exchange: Exchange) -> str:
    return "tier:" + exchange.session_key()


class SessionPin(FactSource):
    name = "session"

    def __init__(self, sessions: SessionState, routers: BundleRouters) -> None:
        self._sessions = sessions
        self._routers = routers

    async def gather(self, exchange: Exchange) -> Any:
        if self._routers.covering(exchange) is None:
            return None
        try:
            tier = await self._sessions.get(pin_key(exchange))
        except StoreUnavailable as error:
            log.warning("request %s: the session's tier cannot be read: %s", exchange.request_id, error)
            return None
        except Exception as error:  # absent, never raised: the tier is then decided again
            log.error("request %s: the session's tier cannot be read: %s", exchange.request_id, type(error).__name__)
            return None
        return {"tier": tier} if tier else None

    async def decided(self, exchange: Exchange) -> None:
        plan = exchange.plan
        record = plan.routing.layer_record(LAYER) if plan is not None else None
        # Only a tier whose model serves is pinned: one whose substitute was refused (not
        # granted, breakers open, too small) would move the conversation once it is allowed.
        if record is None or record.get("pinned") is not False or not record.get("applied") or not isinstance(record.get("tier"), str):
            return
        covered = self._routers.covering(exchange)
        if covered is None:
            return
        try:
            await self._sessions.put_if_absent(pin_key(exchange), record["tier"], covered[0].pin_ttl_seconds * 1000)
        except StoreUnavailable as error:
            log.warning("request %s: the session's tier cannot be pinned: %s", exchange.request_id, error)
        except Exception as error:  # the request goes on; its next turn decides again
            log.error("request %s: the session's tier cannot be pinned: %s", exchange.request_id, type(error).__name__)
