"""Two-phase governance, the pure part (seed §3): what a request is charged to, how
much is reserved before dispatch, what the settlement replaces it with, and which
budget thresholds a settlement crosses.

A *counter* is one (scope, metric, period): ``team:payments`` × ``cost`` × ``month``.
Its key also names the period instance (``M2026-11``), so a new period is a new
counter and nothing ever needs resetting. Requests count 1, tokens count input plus
output, cost counts integer micro-USD.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pricing import Price, Usage, micro_usd

REQUESTS, TOKENS, COST = "requests", "tokens", "cost"
MINUTE, DAY, MONTH = "minute", "day", "month"


@dataclass(frozen=True)
class CounterLimit:
    """One counter a request is charged to, with its merged limits (cost in micro-USD)."""

    scope: str
    metric: str
    period: str
    block: int | None
    warn: int | None
    hard: bool
    rules: tuple[str, ...]
    thresholds: tuple[int, ...]

    @classmethod
    def from_plan(cls, entry: Mapping[str, Any], principal: Mapping[str, Any]) -> CounterLimit:
        def amount(value: Any) -> int | None:
            if value is None:
                return None
            return micro_usd(str(value)) if entry["metric"] == COST else int(value)

        return cls(
            scope=fill_scope(entry["scope"], principal),
            metric=entry["metric"],
            period=entry["period"],
            block=amount(entry["block"]),
            warn=amount(entry["warn"]),
            hard=bool(entry["hard"]),
            rules=tuple(entry["rules"]),
            thresholds=tuple(entry.get("thresholds", ())),
        )

    def describe(self) -> str:
        return f"{self.metric}/{self.period} on {self.scope}"


@dataclass(frozen=True)
class Limits:
    counters: tuple[CounterLimit, ...] = ()
    unlimited: tuple[str, ...] = ()
    effective: Mapping[str, Any] | None = None

    @classmethod
    def from_plan(cls, document: Mapping[str, Any] | None, principal: Mapping[str, Any]) -> Limits:
        if not document:
            return cls()
        return cls(
            counters=tuple(CounterLimit.from_plan(entry, principal) for entry in document["counters"]),
            unlimited=tuple(document.get("unlimited", ())),
            effective=document.get("effective") or {},
        )

    @property
    def blocking(self) -> bool:
        """True when some counter refuses traffic past its limit: such traffic fails
        closed when the counters cannot be reached."""
        return any(counter.block is not None for counter in self.counters)


def fill_scope(scope: str, principal: Mapping[str, Any]) -> str:
    """A scope with the request's ids in place of the policy's `{user}` / `{key}`."""
    if "{" not in scope:
        return scope
    return scope.replace("{user}", str(principal.get("user"))).replace("{key}", str(principal.get("key_id")))


# Rate limits (rpm, tpm) are sliding windows, not calendar minutes: a request is admitted
# only if what was admitted in the 60 seconds before it, plus its own amount, stays within
# the limit. So no 60-second span, wherever it starts, holds more than the limit — a burst
# straddling a minute boundary cannot get the limit twice. The store keeps a log of the
# window's entries (time, reservation, amount) beside its running total.
WINDOW_MS = 60_000
WINDOW = "w60"  # the instance name of every window counter: it never rolls over


def windowed(period: str) -> bool:
    return period == MINUTE


def window_wait_ms(entries: Iterable[tuple[int, int]], value: int, charge: Charge, now_ms: int) -> int:
    """Milliseconds until enough of a window's oldest entries (``(at_ms, amount)``, oldest
    first) have left it for ``charge`` to fit; the stores apply the same rule in place."""
    limit = charge.limit
    assert limit.block is not None
    needed = value + charge.amount - limit.block if limit.hard else value - limit.block + 1
    freed, last = 0, now_ms - WINDOW_MS
    for at_ms, amount in entries:
        if freed >= needed:
            break
        freed, last = freed + amount, at_ms
    return max(0, last + WINDOW_MS - now_ms)


def period_key(period: str, now: dt.datetime) -> str:
    """The instance of a period ``now`` falls in (UTC): d2026-11-30, M2026-11; a rate
    window has one instance for ever (``w60``)."""
    now = now.astimezone(dt.UTC)
    if windowed(period):
        return WINDOW
    # strftime's spelling (glibc's %Y does not pad years), at a fifth of its cost: once per counter per request.
    if period == DAY:
        return f"d{now.year}-{now.month:02d}-{now.day:02d}"
    return f"M{now.year}-{now.month:02d}"


def period_range(instance: str) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of a calendar period instance named by ``period_key``."""
    kind, text = instance[0], instance[1:]
    if kind == "d":
        start = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.UTC)
        return start, period_end(DAY, start)
    start = dt.datetime.strptime(text, "%Y-%m").replace(tzinfo=dt.UTC)
    return start, period_end(MONTH, start)


def period_end(period: str, now: dt.datetime) -> dt.datetime:
    """When the period ``now`` is in ends; for a window, when an entry made now leaves it."""
    now = now.astimezone(dt.UTC)
    if windowed(period):
        return now + dt.timedelta(milliseconds=WINDOW_MS)
    if period == DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0) + dt.timedelta(days=1)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first + dt.timedelta(days=32)).replace(day=1)


@dataclass(frozen=True)
class Charge:
    """An amount against one counter instance, with the limits that govern it."""

    key: str
    limit: CounterLimit
    amount: int
    expires_at: dt.datetime  # when the counter instance can be forgotten

    def as_record(self) -> dict[str, Any]:
        """What the ledger keeps of a charge, enough to settle and reconcile it later."""
        limit = self.limit
        ceiling = limit.block if limit.block is not None else limit.warn
        return {"key": self.key, "metric": limit.metric, "amount": self.amount, "ceiling": ceiling, "thresholds": list(limit.thresholds)}


@dataclass(frozen=True)
class Bound:
    """A conservative upper bound of what one call can consume."""

    tokens: int  # estimated input + output ceiling
    cost_micro_usd: int
    estimate: str  # how the input was sized, e.g. "tiktoken:cl100k_base" or "approximate:utf8/2"


def bound_for(sizes: Iterable[tuple[int, int, Price]], estimate: str) -> Bound:
    """The largest tokens and cost over the targets a request may be sent to, each
    sized as (input tokens, output ceiling, price): failover must stay within it."""
    tokens = cost = 0
    for input_tokens, output_ceiling, price in sizes:
        tokens = max(tokens, input_tokens + output_ceiling)
        # Input may be written to the provider's prompt cache, which can cost more than input.
        as_input = price.cost(Usage(input=input_tokens, output=output_ceiling))
        as_cache_write = price.cost(Usage(cache_write=input_tokens, output=output_ceiling))
        cost = max(cost, as_input, as_cache_write)
    return Bound(tokens, cost, estimate)


def charges(limits: Limits, bound: Bound, now: dt.datetime) -> list[Charge]:
    """What reserving ``bound`` charges to each of the request's counters."""
    amounts = {REQUESTS: 1, TOKENS: bound.tokens, COST: bound.cost_micro_usd}
    periods = {counter.period for counter in limits.counters}
    instances = {period: period_key(period, now) for period in periods}
    expiries = {period: period_end(period, now) + _GRACE[period] for period in periods}
    return [Charge(f"{c.scope}|{c.metric}|{instances[c.period]}", c, amounts[c.metric], expiries[c.period]) for c in limits.counters]


@dataclass(frozen=True)
class Verdict:
    blocked: Charge | None
    warnings: tuple[Charge, ...]
    unmetered: bool = False  # recorded durably, but the counters could not be reached
    retry_after_ms: int | None = None  # a blocked window: until enough of it has left


def judge(charges: Iterable[Charge], current: Mapping[str, int]) -> Verdict:
    """Whether adding every charge to its counter's current value stays within the
    limits. A hard limit must hold after the charge; a soft one (a budget without
    hard_cap) only needs the counter to be below it, so the crossing request runs."""
    charges = list(charges)
    for charge in charges:
        block, value = charge.limit.block, current.get(charge.key, 0)
        if block is not None and (value + charge.amount > block if charge.limit.hard else value >= block):
            return Verdict(charge, ())
    warnings = tuple(c for c in charges if c.limit.warn is not None and current.get(c.key, 0) + c.amount > c.limit.warn)
    return Verdict(None, warnings)


def refusal(charge: Charge, now: dt.datetime, retry_after_ms: int | None = None) -> GatewayError:
    """The client-facing error for a blocked charge: 402 for money, 429 for the rest,
    with retry-after set to when the counter's period ends (a window: ``retry_after_ms``,
    when enough of it has left). A request whose bound alone is over the limit can never
    pass it: that says so, and invites no retry."""
    limit = charge.limit
    if limit.hard and limit.block is not None and limit.metric != REQUESTS and charge.amount > limit.block:
        what = "budget" if limit.metric == COST else f"{limit.metric}-per-{limit.period} limit"
        kind = ErrorKind.PAYMENT_REQUIRED if limit.metric == COST else ErrorKind.INVALID_REQUEST
        return GatewayError(
            kind, f"this request could use more than the whole {what} ({limit.scope}); lower max_tokens or shorten the input", code="request_exceeds_limit"
        )
    if retry_after_ms is not None:
        retry_after = max(1, -(-retry_after_ms // 1000))
    else:
        retry_after = max(1, int((period_end(limit.period, now) - now).total_seconds() + 0.999))
    if limit.metric == COST:
        return GatewayError(
            ErrorKind.PAYMENT_REQUIRED, f"the budget for this {limit.period} is exhausted ({limit.scope})", code="budget_exceeded", retry_after=retry_after
        )
    what = "request rate" if limit.metric == REQUESTS else ("token rate" if limit.period == MINUTE else "daily token quota")
    code = "quota_exceeded" if limit.period != MINUTE else "rate_limited"
    return GatewayError(ErrorKind.RATE_LIMITED, f"the {what} limit is reached ({limit.scope}); try again later", code=code, retry_after=retry_after)


def settled_amounts(reserved: Iterable[Charge], tokens: int, cost_micro_usd: int) -> dict[str, int]:
    """What each counter keeps once the actual usage is known (a request still counts 1)."""
    actual = {REQUESTS: 1, TOKENS: tokens, COST: cost_micro_usd}
    return {charge.key: actual[charge.limit.metric] for charge in reserved}


def reached_thresholds(charge: Mapping[str, Any], value: int) -> list[int]:
    """Budget thresholds (percent of the blocking, else the warning, limit) a counter's
    value has reached. The ledger fires each once per counter instance; the value
    includes open reservations, so a threshold may fire a little early, never late."""
    ceiling = charge.get("ceiling")
    if not ceiling:
        return []
    return [t for t in charge.get("thresholds", ()) if value * 100 >= t * ceiling]


# Counter instances are kept a little past their period so late settlements land.
_GRACE = {MINUTE: dt.timedelta(minutes=2), DAY: dt.timedelta(days=2), MONTH: dt.timedelta(days=35)}


def instance_expiry(instance: str) -> dt.datetime:
    """When a calendar counter instance (``M2026-11``) can be forgotten: as ``charges``
    sets it, for a store that loads the counter without a charge at hand."""
    _, end = period_range(instance)
    return end + _GRACE[DAY if instance.startswith("d") else MONTH]
