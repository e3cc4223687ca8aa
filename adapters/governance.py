"""Stages 6 and 11: reserve before dispatch, settle after the outcome is known.

Before a request goes anywhere its input is sized, the output ceiling added, and the
bound priced for the dearest target it may fail over to; that bound is reserved on
every counter the plan charges — money and quota together, all or nothing. After the
response, the reservation is replaced by what the provider reported. A stream that
ended without final usage keeps the whole bound, pending reconciliation: never zero.
The request's audit outcome says what the ledger holds for it (``charged_micro_usd``),
sub-calls included, so the audit log and the ledger sum to the same spend.

Auxiliary calls the gateway makes for a request (a classifier, a router model, a paid
guard) use the same contract through ``reserve_subcall`` and ``settle_subcall``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.context_fit import judge
from portcullis.adapters.pipeline import Admission, Clock, Exchange, Step, utc_now
from portcullis.adapters.protocols.registry import protocol
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.adapters.providers import Provider
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.ledger import Final, Ledger, Reservation
from portcullis.adapters.token_counts import TokenCounts
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.context_fit import EXACT, UPPER_BOUND, Sized
from portcullis.engine.context_fit import refusal as fit_refusal
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.governance import Bound, Limits, bound_for, charges, refusal, settled_amounts
from portcullis.engine.plan import Target
from portcullis.engine.pricing import Usage
from portcullis.engine.tokens import count_input_tokens

log = logging.getLogger("portcullis.governance")
BUDGET_WARNING_HEADER = "x-portcullis-budget-warning"

LARGE_BODY_BYTES = 32 * 1024  # sized on a worker thread above this: tiktoken releases the GIL
# Attempts after which the provider may have done, and billed, work the gateway never
# saw the usage of: their request keeps its whole bound, pending reconciliation.
UNCERTAIN_OUTCOMES = {"timeout", "connection_lost", "response_too_large", "malformed_response", "malformed_stream"}


@dataclass
class Metering:
    """What governance recorded on an exchange."""

    reservation: Reservation | None = None
    warnings: tuple[str, ...] = ()
    unmetered: bool = False  # counters unreachable and no hard limit applied
    state: str | None = None


class Governance(Step[Metering]):
    layer = "budget"

    def __init__(self, ledger: Ledger, providers: dict[str, Provider], audit: AuditLog, clock: Clock = utc_now) -> None:
        self._ledger = ledger
        self._providers = providers
        self._audit = audit
        self._clock = clock
        # A sub-call's reservation id -> its request's audit outcome, until the sub-call settles.
        self._subcall_outcomes: dict[str, dict[str, Any]] = {}
        self._token_counts = TokenCounts()  # an agent's earlier turns are counted once

    async def admit(self, exchange: Exchange) -> Admission[Metering]:
        assert exchange.plan is not None and exchange.request is not None and exchange.bundle is not None
        request, targets = exchange.request, exchange.targets
        # A hard limit needs a real bound: the output is then capped upstream, not just assumed.
        cap_output = any(c.hard and c.block is not None and c.metric != "requests" for c in exchange.plan.limits.counters)
        counted: dict[bool, tuple[int, str]] = {}  # the input sized once per counting method
        team = exchange.principal.team if exchange.principal is not None else None
        sized = await self._sized(request, targets, counted, team)
        # Routing layer L5: only targets that hold the request as it will be sent go on, and are reserved for.
        verdicts = await judge(exchange.bundle, request, sized, lambda: self._tokens(request, True, counted, team))
        fitting = tuple(verdict.target for verdict in verdicts if verdict.fits)
        exchange.rejected_targets.extend(verdict.rejected() for verdict in verdicts if not verdict.fits)
        if targets and not fitting:
            raise fit_refusal(verdicts)
        bound = self._bound(exchange.bundle, request, [item for item in sized if item.target in fitting], counted, exchange.day)
        metering = await self._reserve(exchange, "main", exchange.plan.limits, bound)
        if metering.warnings:
            exchange.headers[BUDGET_WARNING_HEADER] = "; ".join(f"limit passed: {warning}" for warning in metering.warnings)
        exchange.audit_started.update(_reservation_record(metering))
        bound_tokens = metering.reservation.bound.tokens if metering.reservation is not None else 0
        narrowed = fitting if len(fitting) < len(targets) else None
        return Admission(metering, cap_output=cap_output, bound_tokens=bound_tokens, targets=narrowed)

    async def settle(self, exchange: Exchange, metering: Metering) -> None:
        if metering.reservation is None:
            return
        reservation = metering.reservation
        uncertain = any(attempt["outcome"] in UNCERTAIN_OUTCOMES for attempt in exchange.attempts)
        if exchange.served is None:
            final = self._final(reservation, "pending" if uncertain else "released", Usage(), 0, None)
        elif exchange.usage_complete and not uncertain:
            final = self._final(reservation, "settled", exchange.usage, exchange.cost_micro_usd or 0, exchange.served)
        else:
            final = self._final(reservation, "pending", exchange.usage, exchange.cost_micro_usd or 0, exchange.served)
        metering.state = await self._settle(reservation, final)
        exchange.audit_outcome["settlement"] = metering.state
        _add_charge(exchange.audit_outcome, reservation, final, metering.state)

    # --- auxiliary sub-calls -------------------------------------------------------------

    async def reserve_subcall(self, exchange: Exchange, name: str, bound: Bound) -> Reservation | None:
        """Reserve an auxiliary call on the request's counters; refuses like a main call."""
        assert exchange.plan is not None
        metering = await self._reserve(exchange, name, exchange.plan.limits, bound)
        if metering.reservation is not None:
            if len(self._subcall_outcomes) >= _MAX_OPEN_SUBCALLS:  # sub-calls never settled: forget them, not the process's memory
                self._subcall_outcomes.clear()
            self._subcall_outcomes[metering.reservation.id] = exchange.audit_outcome
        return metering.reservation

    async def settle_subcall(self, reservation: Reservation, usage: Usage | None, cost_micro_usd: int, served: Target | None) -> str:
        """Usage known: settled. Served without usage: the bound stays pending. Not served
        (``served`` None): released."""
        state = "settled" if usage is not None else ("pending" if served is not None else "released")
        final = self._final(reservation, state, usage or Usage(), cost_micro_usd, served)
        outcome = await self._settle(reservation, final)
        audit_outcome = self._subcall_outcomes.pop(reservation.id, None)
        if audit_outcome is not None:
            _add_charge(audit_outcome, reservation, final, outcome)
        return outcome

    # --- sizing --------------------------------------------------------------------------

    async def size(self, bundle: ActiveBundle, request: ParsedRequest, targets: tuple[Target, ...], day: dt.date) -> Bound:
        """The bound over ``targets``: input sized the way each target's provider counts,
        the output ceiling, the target's price."""
        counted: dict[bool, tuple[int, str]] = {}
        return self._bound(bundle, request, await self._sized(request, targets, counted), counted, day)

    async def _sized(self, request: ParsedRequest, targets: tuple[Target, ...], counted: dict[bool, tuple[int, str]], team: str | None = None) -> list[Sized]:
        """Each target with its input counted the way its provider counts (``counted``
        keeps one count per method, so the input is sized once per method)."""
        sized = []
        for target in targets:
            exact = protocol(self._providers[target.provider].protocol_for(target.model, request.protocol) or request.protocol).wire.TOKEN_COUNT_EXACT
            sized.append(Sized(target, await self._tokens(request, exact, counted, team), EXACT if exact else UPPER_BOUND))
        return sized

    @staticmethod
    def _bound(bundle: ActiveBundle, request: ParsedRequest, sized: list[Sized], counted: dict[bool, tuple[int, str]], day: dt.date) -> Bound:
        sizes = []
        for item in sized:
            target = item.target
            ceiling = min(request.max_tokens or target.max_output_tokens, target.max_output_tokens) * request.choices
            sizes.append((item.input_tokens, ceiling, bundle.price_for(target, day)))
        methods = {counted[item.method == EXACT][1] for item in sized}
        return bound_for(sizes, "+".join(sorted(methods)))

    async def _tokens(self, request: ParsedRequest, exact: bool, counted: dict[bool, tuple[int, str]], team: str | None = None) -> int:
        if exact not in counted:
            counted[exact] = await self._count(request, exact, team)
        return counted[exact][0]

    async def _count(self, request: ParsedRequest, exact: bool, team: str | None) -> tuple[int, str]:
        segments = self._token_counts.counter(team) if team is not None and exact else None  # sized as a whole when no team scopes the cache
        if len(request.raw) > LARGE_BODY_BYTES:
            return await asyncio.to_thread(count_input_tokens, request.body, exact, segments)
        return count_input_tokens(request.body, exact, segments)

    # --- the ledger ----------------------------------------------------------------------

    async def _reserve(self, exchange: Exchange, name: str, limits: Limits, bound: Bound) -> Metering:
        assert exchange.principal is not None
        now = self._clock()
        reservation = Reservation(
            id=exchange.request_id if name == "main" else f"{exchange.request_id}:{name}",
            request_id=exchange.request_id,
            subcall=name,
            principal=exchange.principal.as_input(),
            charges=tuple(charges(limits, bound, now)),
            bound=bound,
            created_at=now,
        )
        try:
            verdict = await self._ledger.reserve(reservation, fail_open=not limits.blocking)
        except StoreUnavailable as failure:
            if limits.blocking:
                log.error("request %s refused: the ledger is unavailable (%s)", exchange.request_id, failure)
                raise GatewayError(
                    ErrorKind.UNAVAILABLE, "spending and rate limits cannot be checked right now; try again shortly", code="ledger_unavailable", retry_after=5
                ) from None
            log.error("request %s served unmetered and unrecorded: the ledger is unavailable (%s)", exchange.request_id, failure)
            return Metering(unmetered=True)
        if verdict.unmetered:
            log.error("request %s served without counters: they are unavailable; the spend is recorded", exchange.request_id)
        if verdict.blocked is not None:
            raise refusal(verdict.blocked, now, verdict.retry_after_ms)
        return Metering(reservation, tuple(charge.limit.describe() for charge in verdict.warnings), unmetered=verdict.unmetered)

    async def _settle(self, reservation: Reservation, final: Final) -> str:
        try:
            outcome = await self._ledger.settle(reservation.id, reservation.charge_records(), final)
        except StoreUnavailable as failure:
            log.error("settlement of %s failed; it stays open for `portcullis ledger reconcile` (%s)", reservation.id, failure)
            return "open"
        for counter, threshold in outcome.thresholds:
            scope, metric, period = counter.split("|")
            log.warning("budget threshold %d%% crossed on %s (%s)", threshold, scope, period)
            self._audit.append(
                "budget_threshold", counter=counter, scope=scope, metric=metric, period=period, threshold=threshold, request_id=reservation.request_id
            )
        return outcome.state

    @staticmethod
    def _final(reservation: Reservation, state: str, usage: Usage, cost: int, served: Target | None) -> Final:
        bound = reservation.bound
        observed = {"usage": usage.as_dict(), "cost_micro_usd": cost} if served is not None else None
        if state == "pending":  # the whole bound stays charged until reconciled
            return Final(state, bound.tokens, bound.cost_micro_usd, {c.key: c.amount for c in reservation.charges}, observed, _served(served))
        tokens = usage.total
        return Final(state, tokens, cost, settled_amounts(reservation.charges, tokens, cost), observed, _served(served))


_MAX_OPEN_SUBCALLS = 10_000


def _reservation_record(metering: Metering) -> dict[str, Any]:
    """What the request_started record says of the reservation."""
    if metering.reservation is None:
        return {"unmetered": metering.unmetered}
    bound = metering.reservation.bound
    reservation: dict[str, Any] = {
        "bound_tokens": bound.tokens,
        "bound_micro_usd": bound.cost_micro_usd,
        "estimate": bound.estimate,
        "counters": [charge.key for charge in metering.reservation.charges],
    }
    if metering.warnings:
        reservation["warnings"] = list(metering.warnings)
    return {"reservation": reservation}


def _add_charge(audit_outcome: dict[str, Any], reservation: Reservation, final: Final, state: str) -> None:
    """Add what the ledger now holds for a reservation to its request's audit outcome, so
    the audit log and the ledger sum to the same spend: the final cost, the whole bound
    while pending, or — when the settlement could not be written — the bound of the
    still-open reservation. Sub-calls settled for the request count in it too."""
    charged = reservation.bound.cost_micro_usd if state == "open" else final.cost_micro_usd
    audit_outcome["charged_micro_usd"] = audit_outcome.get("charged_micro_usd", 0) + charged


def _served(target: Target | None) -> dict[str, Any] | None:
    return target.describe() if target is not None else None


@dataclass(frozen=True)
class Resolution:
    reservation_id: str
    previous_state: str
    cost_micro_usd: int
    note: str
    replayed: bool


async def reconcile(ledger: Ledger, bundle: ActiveBundle, older_than: dt.datetime, evidence: dict[str, dict[str, Any]]) -> list[Resolution]:
    """Resolve every reservation no settlement completed: streams that ended without
    final usage (pending) and calls whose process died before settling (open, older
    than ``older_than``). Usage from the provider's records (``evidence``, by request
    id) replaces the charge; without it the conservative bound stays charged."""
    resolutions = []
    for item in await ledger.unresolved(older_than):
        usage_record = evidence.get(item.request_id)
        served = (usage_record or {}).get("served") or item.served
        amounts = {charge["key"]: charge["amount"] for charge in item.charges}
        tokens, cost, note = item.bound_tokens, item.bound_micro_usd, "no usage evidence: the conservative bound stays charged"
        if usage_record is not None and served is not None:
            usage = Usage(**{name: int(usage_record.get(name, 0)) for name in ("input", "output", "cache_read", "cache_write")})
            price = bundle.prices.price_for(served["provider"], served["model"], served.get("region"), item.created_at.date())
            if price is not None:
                tokens = usage.total
                cost = price.cost(usage)
                amounts = {charge["key"]: {"requests": 1, "tokens": tokens, "cost": cost}[charge["metric"]] for charge in item.charges}
                note = "usage from the provider's records"
        final = Final("reconciled", tokens, cost, amounts, usage_record, served, note)
        outcome = await ledger.settle(item.id, item.charges, final)
        resolutions.append(Resolution(item.id, item.state, cost, note, outcome.replayed))
    return resolutions
