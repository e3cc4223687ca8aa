"""Every upstream call the gateway makes — the request's own and each billable
sub-call (the PII classifier today; routers and paid guards later) — goes through
one dispatcher: target → credential from the provider's key pool → headers → send →
failover and cool-down → the caller reads the answer.

Targets are tried in order until one answers. Nothing has reached the client while
the dispatcher runs, so any failure may move on to the next target: one that cannot
express the request, one whose keys are all at capacity, an unreachable one, a non-2xx
answer, or an answer the caller finds unusable (``TryNext``). A provider that says the
request itself is wrong (400, 413, 422, 431) ends the search: the next would say it too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from portcullis.adapters.protocols.registry import DEFAULT_UPSTREAM, Route, route
from portcullis.adapters.providers import Provider, UpstreamResponse, UpstreamUnreachable
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.upstream_errors import CLIENT_ERROR_STATUS, TryNext, unreachable, upstream_error
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
    affinity: str | None = None  # the conversation's key: a pool of pods sends each turn to the same one

    def record(self, target: Target, outcome: str, status: int | None = None) -> None:
        self.attempts.append({**target.describe(), "outcome": outcome, "status": status})


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
    def __init__(self, providers: Mapping[str, Provider], pools: Mapping[str, KeyPool], max_attempts: int, pooled: Collection[str] = ()) -> None:
        self._providers = providers
        self._pools = pools
        self._max_attempts = max_attempts
        self._pooled = frozenset(pooled)  # providers with several endpoints, which pick one by a call's affinity

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
            pool = self._pools[target.provider]
            try:
                key, wait = await pool.take(call.tokens)
            except StoreUnavailable:  # supply bookkeeping is down: the provider still decides
                log.warning("request %s: provider key capacity unavailable; using the first key", call.request_id)
                key, wait = pool.first, 0
            if key is None:  # every key of this provider is full this minute or cooling down
                call.record(target, "no_capacity")
                last_error = GatewayError(
                    ErrorKind.RATE_LIMITED, "the model's providers are at capacity; try again later", code="no_capacity", retry_after=wait
                )
                continue
            headers = pair.upstream.wire.upstream_headers(key.secret, call.forward_headers)  # the credential joins only here
            headers.update(call.extra_headers(target.provider))
            if call.guardrail is not None:  # after the client's own: the policy's replaces whatever it sent
                body = pair.upstream.wire.require_guardrail(body, headers, call.guardrail)
            try:
                path = call.path or pair.upstream.wire.upstream_path(target.model, call.stream)
                upstream = await provider.send(path, call.query, headers, body, affinity=call.affinity)
            except UpstreamUnreachable as failure:
                call.record(target, failure.reason)
                last_error = unreachable(failure)
                continue
            if upstream.status >= 300:
                error = await upstream_error(upstream)
                call.record(target, f"status_{upstream.status}", upstream.status)
                if upstream.status == 429:
                    await _quietly(pool.cool_down(key, error.retry_after))
                if upstream.status in CLIENT_ERROR_STATUS:
                    raise DispatchFailed(error)
                last_error = error
                continue
            try:
                return await answer(Attempt(target, pair, upstream))
            except TryNext as retry:
                call.record(target, retry.reason)
                last_error = retry.error
        raise DispatchFailed(last_error)


async def _quietly(action: Awaitable[None]) -> None:
    try:
        await action
    except StoreUnavailable:
        log.warning("provider key cooldown could not be recorded")
