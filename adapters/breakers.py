"""Circuit breakers (L6) as the gateway runs them: what the policy is told of them
(the ``breakers`` fact), what the dispatcher asks before sending to a target (may it
go, and is it the one probe of a half-open breaker) and what it records after.

The policy decides: a target whose breaker is open is not authorised for the
request. The dispatcher only gates the half-open probe and counts outcomes, and only
the target's own failures count (a timeout, a refused or dropped connection, a 5xx or
408, a stream that failed before its first byte): a request the provider refused as
wrong, a rate limit (key cool-downs handle those) or a client that went away say
nothing about the target's health.

Reading the board costs a store round trip, so each process keeps the last reading
for ``cache_seconds`` (0.5 s) and reads it again sooner only after a change of its
own. Breakers are an availability optimisation: when the store cannot be reached,
every target counts as closed and the request goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from portcullis.adapters.pipeline import Exchange, FactSource
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.breakers import EMPTY_VIEW, BoardView, BreakerBoard
from portcullis.engine.breakers import BreakerRule, BreakerSettings, target_id
from portcullis.engine.target import Target

if TYPE_CHECKING:
    from portcullis.adapters.audit_log import AuditLog
    from portcullis.engine.activation import ActiveBundle

log = logging.getLogger("portcullis.breakers")

CACHE_SECONDS = 0.5
# Attempt outcomes (see Dispatcher.dispatch, relay.py) that are the target's own failure.
_TARGET_FAILURES = frozenset({"timeout", "connect", "connection_lost", "malformed_response", "empty_stream", "malformed_stream", "error_event"})

Admit = Literal["send", "probe", "skip"]


def counts_against_target(outcome: str, status: int | None) -> bool:
    """Whether an attempt's failure is the target's (and counts toward opening its breaker)."""
    if status is not None:
        return status >= 500 or status == 408
    return outcome in _TARGET_FAILURES


def settings_of(bundle: ActiveBundle | None) -> BreakerSettings | None:
    """The active bundle's breaker settings (None: it has none, and breakers are off)."""
    if bundle is None:
        return None
    cached = _SETTINGS.get(bundle.digest)
    if cached is None:
        data = (bundle.bundle.data.get("portcullis") or {}).get("breakers")
        cached = (BreakerSettings.from_data(data),)
        if len(_SETTINGS) > 16:  # a few bundles a process lifetime; never grows with traffic
            _SETTINGS.clear()
        _SETTINGS[bundle.digest] = cached
    return cached[0]


_SETTINGS: dict[str, tuple[BreakerSettings | None]] = {}


class Breakers:
    def __init__(
        self,
        board: BreakerBoard,
        audit: AuditLog | None = None,
        clock: Callable[[], float] = time.time,
        cache_seconds: float = CACHE_SECONDS,
    ) -> None:
        self._board = board
        self._audit = audit
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._view: BoardView = EMPTY_VIEW
        self._read_at = -math.inf  # on this process's monotonic clock
        self._reading = asyncio.Lock()

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def view(self) -> BoardView:
        """The board as last read, read again when older than ``cache_seconds`` (by one
        request: the others arriving meanwhile wait for its reading)."""
        if self._fresh():
            return self._view
        async with self._reading:
            if self._fresh():
                return self._view
            try:
                self._view = await self._board.view()
            except StoreUnavailable:
                log.warning("circuit breakers unavailable: the store cannot be reached; every target counts as closed")
                self._view = EMPTY_VIEW
            self._read_at = time.monotonic()
        return self._view

    def _fresh(self) -> bool:
        return time.monotonic() - self._read_at < self._cache_seconds

    async def facts(self) -> dict[str, Any] | None:
        """``input.facts.breakers``: each breaker that is not closed, by target; an open
        one with the epoch second it half-opens (stable while it is open, so equal
        decisions still share the policy's cache)."""
        view, now = await self.view(), self.now_ms()
        facts: dict[str, Any] = {}
        for target, until in view.open_until.items():
            facts[target] = {"state": "open", "until": math.ceil(until / 1000)} if until > now else {"state": "half_open"}
        return facts or None

    def states(self) -> dict[str, str]:
        """From the last reading, without reading again: each breaker that is not closed,
        by target, ``open`` or ``half_open`` (the metrics' gauge)."""
        now = self.now_ms()
        return {target: "open" if until > now else "half_open" for target, until in self._view.open_until.items()}

    async def admit(self, target: Target, rule: BreakerRule) -> Admit:
        """Whether a request may go to ``target`` now: ``send``, ``probe`` (it is the one
        request testing a half-open breaker), or ``skip``."""
        name, now = target_id(target), self.now_ms()
        state = (await self.view()).state(name, now)
        if state == "closed":
            return "send"
        if state == "open":
            return "skip"
        try:
            claim = await self._board.claim_probe(name, rule.open_ms, now)
        except StoreUnavailable:
            return "send"
        if claim == "closed":
            self._read_at = -math.inf
            return "send"
        return "probe" if claim == "probe" else "skip"

    async def release(self, target: Target) -> None:
        """A probe whose outcome said nothing of the target's health: another may go."""
        with contextlib.suppress(StoreUnavailable):  # else the lease expires on its own
            await self._board.release_probe(target_id(target))

    def seconds_until_half_open(self, target: Target) -> int:
        """From the last reading: when a probe may next go to ``target`` (at least 1)."""
        until = self._view.open_until.get(target_id(target), 0)
        return max(1, math.ceil((until - self.now_ms()) / 1000))

    async def failed(self, target: Target, rule: BreakerRule, request_id: str) -> None:
        name = target_id(target)
        try:
            transition, until = await self._board.failed(name, rule, self.now_ms())
        except StoreUnavailable:
            log.warning("request %s: a failure of %s could not be counted: the store cannot be reached", request_id, name)
            return
        if transition is None:
            if name not in self._view.failing:
                self._read_at = -math.inf  # a success here must now reset the count
            return
        self._read_at = -math.inf
        half_open_at = math.ceil(until / 1000)
        if transition == "opened":
            log.warning(
                "circuit breaker opened: target %s after %d consecutive failures; skipped for %.0f s (request %s)",
                name,
                rule.consecutive_failures,
                rule.open_seconds,
                request_id,
            )
            self._record("breaker_opened", name, request_id, failures=rule.consecutive_failures, open_seconds=rule.open_seconds, half_open_at=half_open_at)
        else:
            log.warning("circuit breaker re-opened: target %s failed its probe; skipped for %.0f s (request %s)", name, rule.open_seconds, request_id)
            self._record("breaker_reopened", name, request_id, open_seconds=rule.open_seconds, half_open_at=half_open_at)

    async def succeeded(self, target: Target, probe: bool, request_id: str) -> None:
        """A healthy answer: resets the count; the probe's also closes the breaker. Free
        when this process last saw nothing to reset."""
        name = target_id(target)
        if not probe and not (await self.view()).watched(name):
            return
        try:
            closed = await self._board.succeeded(name, probe)
        except StoreUnavailable:
            log.warning("request %s: a success of %s could not be recorded: the store cannot be reached", request_id, name)
            return
        self._read_at = -math.inf
        if closed:
            log.info("circuit breaker closed: target %s answered %s (request %s)", name, "its probe" if probe else "a request", request_id)
            self._record("breaker_closed", name, request_id, probe=probe)

    def _record(self, event: str, target: str, request_id: str, **fields: Any) -> None:
        if self._audit is not None:
            self._audit.append(event, target=target, request_id=request_id, **fields)


class BreakerFacts(FactSource):
    """``input.facts.breakers``: the targets whose breaker is open or half-open."""

    name = "breakers"

    def __init__(self, breakers: Breakers) -> None:
        self._breakers = breakers

    async def gather(self, exchange: Exchange) -> Any:
        if settings_of(exchange.bundle) is None:
            return None
        return await self._breakers.facts()
