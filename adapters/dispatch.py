"""Every upstream call the gateway makes — the request's own and each billable
sub-call (the PII classifier today; routers and paid guards later) — goes through
one dispatcher: target → credential from the provider's key pool → headers → send →
failover and cool-down → the caller reads the answer.

Targets are tried in order until one answers. Nothing has reached the client while
the dispatcher runs, so any failure may move on to the next target: one that cannot
express the request, one whose keys are all at capacity, an unreachable one, a non-2xx
answer, or an answer the caller finds unusable (``TryNext``). A provider that says the
request itself is wrong (400, 413, 422, 431) ends the search: the next would say it too.

Each attempt's outcome is counted on the target's circuit breaker (``Breakers``) when
the call names the bundle's breaker settings; a target whose breaker is open is
skipped (the policy already left it out; this catches one that opened since), and of
a half-open one only the request holding its single probe is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from portcullis.adapters.breakers import Breakers, counts_against_target
from portcullis.adapters.protocols.registry import DEFAULT_UPSTREAM, Route, route
from portcullis.adapters.providers import Provider, UpstreamResponse, UpstreamUnreachable
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.upstream_errors import CLIENT_ERROR_STATUS, TryNext, unreachable, upstream_error
from portcullis.engine.breakers import BreakerSettings
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import Target

log = logging.getLogger("portcullis.dispatch")
T = TypeVar("T")


def _no_headers(provider: str) -> Mapping[str, str]:
    return {}


@dataclass
class Call:
    """One upstream call. ``protocol`` is the one ``body`` is built from (the client's
    for the request's own call; None for a sub-call, which speaks each provider's own);
    ``tokens`` is what the call may use, taken from the chosen key's capacity."""

    request_id: str
    protocol: str | None
    targets: Sequence[Target]
    body: Callable[[Route, Target], Awaitable[bytes]]
    tokens: int = 0
    query: str = ""
    forward_headers: Mapping[str, str] = field(default_factory=dict)
    extra_headers: Callable[[str], Mapping[str, str]] = _no_headers
    attempts: list[dict[str, Any]] = field(default_factory=list)  # each target tried, for the audit record
    path: str | None = None  # the endpoint called; None: the upstream protocol's inference path
    stream: bool = False  # the inference path of a streamed answer (Bedrock names it apart)
    guardrail: Mapping[str, str] | None = None  # the provider-side guardrail the policy requires (Bedrock)
    breakers: BreakerSettings | None = None  # the bundle's circuit breakers; None: not consulted, not counted
    probing: Target | None = None  # the target this call holds a half-open breaker's one probe for
    affinity: str | None = None  # the conversation's key: a pool of pods sends each turn to the same one
    on_attempt: Callable[[dict[str, Any]], None] | None = None  # told of each attempt as it is recorded (its trace span)

    def record(self, target: Target, outcome: str, status: int | None = None) -> None:
        attempt = {**target.describe(), "outcome": outcome, "status": status}
        if target == self.probing:
            attempt["breaker_probe"] = True
        self.attempts.append(attempt)
        if self.on_attempt is not None:
            self.on_attempt(attempt)


@dataclass(frozen=True)
class Attempt:
    """A target that answered 2xx: the caller reads ``upstream`` and releases it."""

    target: Target
    route: Route
    upstream: UpstreamResponse


class DispatchFailed(Exception):
    """No target served the call; ``error`` is what its client is told."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.code)
        self.error = error


class Dispatcher:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        pools: Mapping[str, KeyPool],
        max_attempts: int,
        pooled: Collection[str] = (),
        breakers: Breakers | None = None,
    ) -> None:
        self._providers = providers
        self._pools = pools
        self._max_attempts = max_attempts
        self._pooled = frozenset(pooled)  # providers with several endpoints, which pick one by a call's affinity
        self._breakers = breakers

    def picks_endpoints(self, targets: Sequence[Target]) -> bool:
        """Whether a call to ``targets`` may use an affinity key (worth computing)."""
        return any(target.provider in self._pooled for target in targets)

    def protocol_of(self, target: Target, default: str | None = None) -> str:
        """The protocol ``target``'s provider speaks (a provider that speaks any: ``default``)."""
        return self._providers[target.provider].protocol_for(target.model, default) or default or DEFAULT_UPSTREAM

    async def dispatch(self, call: Call, answer: Callable[[Attempt], Awaitable[T]]) -> T:
        """``answer`` reads a 2xx response into the caller's result, records the attempt
        as served (``call.record``) once it commits, or raises ``TryNext``."""
        last_error = GatewayError(ErrorKind.UPSTREAM, "no target could serve the request")
        breakers = self._breakers if call.breakers is not None else None
        for target in call.targets[: self._max_attempts]:
            provider = self._providers[target.provider]
            upstream_protocol = self.protocol_of(target, call.protocol)
            pair = route(call.protocol or upstream_protocol, upstream_protocol)
            try:
                body = await call.body(pair, target)
            except GatewayError as error:  # this target cannot express the request; another might
                call.record(target, "unconvertible")
                last_error = error
                continue
            health = _Health(breakers, call, target) if breakers is not None else None
            if health is not None and not await health.admit():
                call.record(target, "breaker_open")
                last_error = health.unavailable()
                continue
            pool = self._pools[target.provider]
            try:
                key, wait = await pool.take(call.tokens)
            except StoreUnavailable:  # supply bookkeeping is down: the provider still decides
                log.warning("request %s: provider key capacity unavailable; using the first key", call.request_id)
                key, wait = pool.first, 0
            except BaseException:  # a half-open breaker's probe must not stay leased to nothing
                await _settled(health, "gateway_error", None)
                raise
            if key is None:  # every key of this provider is full this minute or cooling down
                call.record(target, "no_capacity")
                last_error = GatewayError(
                    ErrorKind.RATE_LIMITED, "the model's providers are at capacity; try again later", code="no_capacity", retry_after=wait
                )
                await _settled(health, "no_capacity", None)
                continue
            try:
                headers = pair.upstream.wire.upstream_headers(key.secret, call.forward_headers)  # the credential joins only here
                headers.update(call.extra_headers(target.provider))
                if call.guardrail is not None:  # after the client's own: the policy's replaces whatever it sent
                    body = pair.upstream.wire.require_guardrail(body, headers, call.guardrail)
                path = call.path or pair.upstream.wire.upstream_path(target.model, call.stream)
                upstream = await provider.send(path, call.query, headers, body, affinity=call.affinity)
            except UpstreamUnreachable as failure:
                call.record(target, failure.reason)
                last_error = unreachable(failure)
                await _settled(health, failure.reason, None)
                continue
            except BaseException:  # the gateway's own failure (or a cancelled request): the probe is released
                await _settled(health, "gateway_error", None)
                raise
            if upstream.status >= 300:
                error = await upstream_error(upstream)
                call.record(target, f"status_{upstream.status}", upstream.status)
                await _settled(health, f"status_{upstream.status}", upstream.status)
                if upstream.status == 429:
                    await _quietly(pool.cool_down(key, error.retry_after))
                if upstream.status in CLIENT_ERROR_STATUS:
                    raise DispatchFailed(error)
                last_error = error
                continue
            try:
                answered = await answer(Attempt(target, pair, upstream))
            except TryNext as retry:
                call.record(target, retry.reason)
                last_error = retry.error
                await _settled(health, retry.reason, None)
                continue
            except BaseException:
                await _settled(health, "gateway_error", None)
                raise
            await _settled(health, "ok", None)
            return answered
        raise DispatchFailed(last_error)


class _Health:
    """One attempt's view of its target's circuit breaker: may it be sent, and, once
    its outcome is known, what that says of the target."""

    def __init__(self, breakers: Breakers, call: Call, target: Target) -> None:
        assert call.breakers is not None
        self._breakers = breakers
        self._call = call
        self._target = target
        self._rule = call.breakers.rule_for(target.provider)
        self._probe = False

    async def admit(self) -> bool:
        verdict = await self._breakers.admit(self._target, self._rule)
        self._probe = verdict == "probe"
        self._call.probing = self._target if self._probe else None
        return verdict != "skip"

    def unavailable(self) -> GatewayError:
        retry_after = self._breakers.seconds_until_half_open(self._target)
        message = "every target of the model is unavailable right now; try again later"
        return GatewayError(ErrorKind.UNAVAILABLE, message, code="targets_unavailable", retry_after=retry_after)

    async def settled(self, outcome: str, status: int | None) -> None:
        request_id = self._call.request_id
        if outcome == "ok":
            await self._breakers.succeeded(self._target, self._probe, request_id)
        elif counts_against_target(outcome, status):
            await self._breakers.failed(self._target, self._rule, request_id)
        elif self._probe:
            await self._breakers.release(self._target)


async def _settled(health: _Health | None, outcome: str, status: int | None) -> None:
    if health is not None:
        await health.settled(outcome, status)


async def _quietly(action: Awaitable[None]) -> None:
    try:
        await action
    except StoreUnavailable:
        log.warning("provider key cooldown could not be recorded")
