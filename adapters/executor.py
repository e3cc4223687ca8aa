"""The request executor: it runs the pipeline for one request.

    authenticate · parse · decide (route and re-authorise every candidate, in Rego) ·
    admission steps (filters, reservations) · audit request_started · dispatch with
    failover until committed · response guards · relay · settlement (cost, then the
    steps) · audit the outcome

Capabilities plug in as ``Step``s (``pipeline.py``) and upstream calls go through the
``Dispatcher``: the executor names no capability and no protocol. The route names the
``Operation``: the stages are the same for each; only the steps that apply to it admit
the request, and what is dispatched differs (an answer relayed and guarded, or a count).
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from portcullis.adapters.audit_log import AuditLog, AuditUnavailable
from portcullis.adapters.audit_records import OUTCOME_EVENTS, log_request, outcome_record, refusal_record, started_record
from portcullis.adapters.auth import Authenticator
from portcullis.adapters.breakers import settings_of
from portcullis.adapters.bundles import BundleManager
from portcullis.adapters.capture import BodyCapture
from portcullis.adapters.config import RequestLimits
from portcullis.adapters.dispatch import Attempt, Call, Dispatcher, DispatchFailed
from portcullis.adapters.error_responses import REQUEST_ID_HEADERS, error_response
from portcullis.adapters.fact_gathering import FactGathering
from portcullis.adapters.ingress import parse_request, read_body, request_id_of, session_of
from portcullis.adapters.json_bytes import compact
from portcullis.adapters.offload import off_loop, serialised
from portcullis.adapters.operations import Operation
from portcullis.adapters.pipeline import Clock, Exchange, FactSource, RequestObserver, ResponseGuard, Step, utc_now
from portcullis.adapters.policy_input import decide
from portcullis.adapters.protocols.interfaces import TokenCounting, WireProtocol
from portcullis.adapters.protocols.registry import Route, protocol
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.adapters.relay import StreamRelay
from portcullis.adapters.streaming import RelayedStream
from portcullis.adapters.telemetry.tracing import Tracer
from portcullis.adapters.upstream_errors import read_json
from portcullis.engine.clients import client_of
from portcullis.engine.conversation import prefix_key
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity.hop import HEADER as HOP_HEADER
from portcullis.engine.plan import Target
from portcullis.engine.pricing import Usage
from portcullis.engine.routing import substitution
from portcullis.engine.tokens import count_input_tokens

log = logging.getLogger("portcullis.gateway")

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_COUNT_BYTES = 1024 * 1024
FALLBACK_HEADER = "x-portcullis-model-fallback"
# Attempt outcomes that sent nothing to the provider (see Dispatcher.dispatch).
UNSENT = frozenset({"unconvertible", "no_capacity", "connect", "credentials", "breaker_open"})
TOKEN_COUNT_HEADER = "x-portcullis-token-count"  # who counted: "provider", or "estimate" (the gateway's approximation)


def internal_error() -> GatewayError:
    return GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error")


class Executor:
    def __init__(
        self,
        bundles: BundleManager,
        authenticator: Authenticator,
        dispatcher: Dispatcher,
        audit: AuditLog,
        steps: list[Step],
        max_request_bytes: int,
        clock: Clock = utc_now,
        limits: RequestLimits = DEFAULT_LIMITS,
        facts: tuple[FactSource, ...] = (),
        observers: tuple[RequestObserver, ...] = (),
        tracer: Tracer | None = None,
        capture: BodyCapture | None = None,
    ) -> None:
        self._bundles = bundles
        self._auth = authenticator
        self._dispatcher = dispatcher
        self._audit = audit
        self._steps = steps
        self._max_request_bytes = max_request_bytes
        self._clock = clock
        self._limits = limits
        self._facts = FactGathering(facts)
        self._observers = observers
        self._tracer = tracer
        self._capture = capture
        self._serve = {Operation.INFERENCE: self._dispatch, Operation.COUNT_TOKENS: self._count}

    # --- the pipeline ------------------------------------------------------------

    async def handle(self, http: Request, protocol: WireProtocol, operation: Operation = Operation.INFERENCE) -> Response | RelayedStream:
        exchange = Exchange(request_id_of(http), protocol, time.monotonic(), self._clock(), operation=operation)
        if self._tracer is not None:
            exchange.trace = self._tracer.start(exchange, http.headers, http.url.path)
        trace = exchange.trace
        stage, layer = "authenticate", None
        trace.at(stage)
        try:
            claim = await self._auth.claim(http)
            exchange.principal = claim.principal  # a key's now; a SigV4 signature's once verified over the body
            stage = "parse"
            trace.at(stage)
            raw = await read_body(http, self._max_request_bytes, self._limits.body_timeout_seconds)
            if exchange.principal is None:
                stage = "authenticate"
                exchange.principal = await self._auth.confirm(claim, http, raw)
                exchange.claim = claim
                stage = "parse"
            exchange.request = await parse_request(protocol, raw, http, self._limits, operation)
            exchange.request.session = session_of(http.headers)
            exchange.request.client = client_of(http.headers.get("user-agent"))
            exchange.request.hop = http.headers.get(HOP_HEADER)
            stage = "decide"
            trace.at(stage)
            exchange.bundle = self._bundles.active  # this request's bundle, whatever reloads meanwhile
            if operation == Operation.INFERENCE:  # routing layers route what is generated, not a count
                await self._facts.gather(exchange)
            exchange.plan = decide(exchange.bundle, exchange.principal, exchange.request, exchange.facts)
            if not exchange.plan.allow:
                raise exchange.plan.refusal(exchange.arrived)
            exchange.targets = exchange.plan.targets
            stage = "admit"
            for step in self._steps:
                if operation in step.operations:  # a step that does not apply never sees the request
                    layer = step.layer
                    trace.at(f"admit {layer}")
                    exchange.admitted(step, await step.admit(exchange))
            layer = None
            if operation == Operation.INFERENCE:  # only an admitted request's decision outlives it (a pinned tier)
                await self._facts.decided(exchange)
            if exchange.body_changed:  # serialised once, whatever number of steps edited it
                exchange.request.raw = await serialised(exchange.request.body, len(exchange.request.raw))
        except GatewayError as error:
            return await self._refuse(exchange, stage, error, layer)
        except Exception:  # a gateway bug before dispatch: refused in the client's protocol, and recorded
            log.exception("request %s: unexpected error at stage %s", exchange.request_id, stage)
            return await self._refuse(exchange, stage, internal_error(), layer)
        if self._capture is not None and operation == Operation.INFERENCE:
            await self._capture_body(exchange)
        try:
            self._audit.append_or_raise("request_started", **started_record(exchange))
        except AuditUnavailable:  # fail closed: nothing unaudited goes upstream
            error = GatewayError(
                ErrorKind.UNAVAILABLE, "the gateway cannot write its audit log right now; try again shortly", code="audit_unavailable", retry_after=5
            )
            return await self._refuse(exchange, "audit", error)
        trace.at("dispatch")
        try:
            return await self._dispatch_within_deadline(exchange)
        except Exception:  # a gateway bug: the started record still gets its outcome
            log.exception("request %s: unexpected error during dispatch", exchange.request_id)
            return await self._finish_failed(exchange, internal_error())

    async def _capture_body(self, exchange: Exchange) -> None:
        """The body as it goes upstream (masked), kept for investigations; its id in the
        started record. Written on a thread: creating a file costs ~50 µs of the loop. A
        capture whose request is then refused (audit unavailable) is named by no record;
        retention deletes it."""
        assert self._capture is not None and exchange.request is not None and exchange.principal is not None
        team, raw = exchange.principal.team, exchange.request.raw
        if not self._capture.wants(team):  # asked here, on the loop: no thread hop for the others
            return
        try:
            capture_id = await asyncio.to_thread(self._capture.store, exchange.request_id, team, raw, "application/json", exchange.arrived)
        except RuntimeError as error:  # no thread to be had (the process is stopping): served without a capture
            log.warning("request %s: not captured (%s)", exchange.request_id, type(error).__name__)
            return
        if capture_id is not None:
            exchange.audit_started["capture_id"] = capture_id

    async def _dispatch_within_deadline(self, exchange: Exchange) -> Response | RelayedStream:
        """Dispatch within the request's total deadline (``limits.request_deadline_seconds``,
        counted from arrival): however many targets stall in turn, the client gets its
        answer started, or a 504, in bounded time."""
        deadline = asyncio.get_running_loop().time() + self._limits.request_deadline_seconds - (time.monotonic() - exchange.started)
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await self._serve[exchange.operation](exchange)
        except TimeoutError:
            if not scope.expired():
                raise
            error = GatewayError(ErrorKind.TIMEOUT, "the request did not get an answer within the gateway's deadline", code="request_deadline")
            return await self._finish_failed(exchange, error)

    def _call(self, exchange: Exchange, targets: tuple[Target, ...], path: str | None = None) -> Call:
        request, plan = exchange.request, exchange.plan
        assert request is not None

        async def body(pair: Route, target: Target) -> bytes:
            return await off_loop(len(request.raw), pair.upstream_body, request, target, exchange.cap_output)

        def extra_headers(provider: str) -> dict[str, str]:
            headers = exchange.trace.outbound_headers()
            for step, state in self._admitted(exchange):
                headers.update(step.outbound_headers(exchange, state, provider))
            return headers

        return Call(
            exchange.request_id,
            request.protocol,
            targets,
            body,
            tokens=exchange.bound_tokens,
            query=request.query,
            forward_headers=request.forward_headers,
            extra_headers=extra_headers,
            attempts=exchange.attempts,
            path=path,
            stream=request.stream and path is None,
            guardrail=plan.guardrail.describe() if plan is not None and plan.guardrail is not None else None,
            affinity=self._affinity(exchange, targets),
            breakers=settings_of(exchange.bundle) if path is None else None,  # a token count neither tests nor trips breakers
            on_attempt=exchange.trace.attempt,
        )

    def _affinity(self, exchange: Exchange, targets: tuple[Target, ...]) -> str | None:
        """The conversation's prefix key: a provider with several pods sends every turn
        to the same one (``system_blocks`` is the bundle's endpoint policy). Hashing a
        long system prompt costs tens of microseconds: done only when a target needs it."""
        request, principal, bundle = exchange.request, exchange.principal, exchange.bundle
        if request is None or principal is None or bundle is None or not self._dispatcher.picks_endpoints(targets):
            return None
        return prefix_key(principal.team, request.tools, exchange.conversation(), bundle.endpoints.system_blocks)

    async def _dispatch(self, exchange: Exchange) -> Response | RelayedStream:
        request = exchange.request
        assert request is not None
        call = self._call(exchange, exchange.targets)

        async def answer(attempt: Attempt) -> Response | RelayedStream:
            if request.stream:
                return await self._relay_stream(exchange, call, attempt)
            return await self._relay_body(exchange, call, attempt)

        try:
            return await self._dispatcher.dispatch(call, answer)
        except DispatchFailed as failed:
            return await self._finish_failed(exchange, failed.error)

    async def _relay_body(self, exchange: Exchange, call: Call, attempt: Attempt) -> Response:
        upstream, pair = attempt.upstream, attempt.route
        raw, document = await read_json(upstream, MAX_RESPONSE_BYTES)
        call.record(attempt.target, "ok", upstream.status)
        exchange.served = attempt.target
        usage = pair.upstream.wire.usage_of(document) if isinstance(document, dict) else None
        exchange.usage = usage or Usage()
        exchange.usage_complete = usage is not None
        if isinstance(document, dict) and pair.upstream.wire.intervened(document):
            exchange.audit_outcome["guardrail_intervened"] = True  # that it did, never what it held back
        exchange.trace.at("guard")
        try:
            for guard in self._guards(exchange, pair):
                if await guard.document(document):
                    raw = compact(document)
            body = pair.client_body(raw, document, int(time.time()))
        except GatewayError as error:  # withheld: the provider's work is still charged
            return await self._finish_failed(exchange, error)
        await self._finish(exchange, "ok")
        self._ended(exchange, 200, "ok")
        return Response(body, 200, headers=self._headers(exchange), media_type="application/json")

    async def _relay_stream(self, exchange: Exchange, call: Call, attempt: Attempt) -> RelayedStream:
        async def finish(outcome: str, error: GatewayError | None) -> None:
            await self._finish(exchange, outcome, error)
            self._ended(exchange, 200, outcome, error)

        relay = StreamRelay(exchange, attempt.route, attempt.upstream, self._guards(exchange, attempt.route), finish)
        await relay.open()  # a stream that fails before its first event is the next target's turn
        exchange.first_upstream_at = time.monotonic()
        call.record(attempt.target, "ok", attempt.upstream.status)
        exchange.served = attempt.target
        assert exchange.request is not None
        converter = attempt.route.stream_converter(exchange.request, int(time.time()))
        headers = {**self._headers(exchange), "content-type": exchange.protocol.wire.FRAMING.CONTENT_TYPE, "cache-control": "no-cache"}
        body = relay.body(converter)
        opening = await anext(body, b"")  # started now, so closing it always settles and audits
        exchange.first_client_at = time.monotonic()
        exchange.trace.at("relay")
        return RelayedStream(200, headers, opening, body)

    # --- a token count ---------------------------------------------------------------

    async def _count(self, exchange: Exchange) -> Response:
        """Forwarded, with failover, to the authorised targets that count in the client's
        protocol, and their answer relayed as they gave it; when none can, counted here and
        labelled an estimate. Nothing is generated, so nothing is priced or settled."""
        request, counting = exchange.request, exchange.protocol.counting
        assert request is not None and counting is not None  # the route exists only for protocols that count
        able = tuple(t for t in exchange.targets if self._dispatcher.protocol_of(t, request.protocol) == request.protocol)
        if not able:
            return await self._estimate(exchange, counting)
        call = self._call(exchange, able, counting.PATH)

        async def answer(attempt: Attempt) -> Response:
            upstream = attempt.upstream
            raw, document = await read_json(upstream, MAX_COUNT_BYTES)
            call.record(attempt.target, "ok", upstream.status)
            tokens = document.get("input_tokens") if isinstance(document, dict) else None
            exchange.audit_outcome["counted_by"] = attempt.target.describe()
            return await self._counted(exchange, raw, "provider", tokens if isinstance(tokens, int) else None)

        try:
            return await self._dispatcher.dispatch(call, answer)
        except DispatchFailed as failed:
            return await self._finish_failed(exchange, failed.error)

    async def _estimate(self, exchange: Exchange, counting: TokenCounting) -> Response:
        """The body that would be sent, counted the way governance sizes it for the first
        target (tiktoken for OpenAI-compatible ones): an approximation, labelled as one."""
        request = exchange.request
        assert request is not None
        first = self._dispatcher.protocol_of(exchange.targets[0], request.protocol) if exchange.targets else request.protocol
        tokens, method = await off_loop(len(request.raw), count_input_tokens, request.body, protocol(first).wire.TOKEN_COUNT_EXACT)
        exchange.audit_outcome["count_method"] = method
        return await self._counted(exchange, counting.estimate_body(tokens), "estimate", tokens)

    async def _counted(self, exchange: Exchange, body: bytes, by: str, tokens: int | None) -> Response:
        exchange.headers[TOKEN_COUNT_HEADER] = by
        exchange.audit_outcome.update(count=by, input_tokens=tokens)
        await self._finish(exchange, "counted")
        self._ended(exchange, 200, "counted")
        return Response(body, 200, headers=self._headers(exchange), media_type="application/json")

    # --- bookkeeping ---------------------------------------------------------------

    def _admitted(self, exchange: Exchange) -> list[tuple[Step, object]]:
        return [(step, exchange.states[id(step)]) for step in self._steps if id(step) in exchange.states]

    def _guards(self, exchange: Exchange, pair: Route) -> list[ResponseGuard]:
        return [guard for step, state in self._admitted(exchange) for guard in step.guards(exchange, state, pair)]

    async def _settle(self, exchange: Exchange) -> None:
        """Cost is the usage the provider reported priced with the bundle's version in
        effect for the served route; then every step that admitted the request settles."""
        if exchange.served is not None and exchange.bundle is not None:
            price = exchange.bundle.price_for(exchange.served, exchange.day)
            exchange.cost_micro_usd = price.cost(exchange.usage)
            exchange.price_version = price.effective_from.isoformat()
        for step, state in self._admitted(exchange):
            try:
                await step.settle(exchange, state)
            except Exception:  # settlement must never turn a served response into a failure
                log.exception("request %s: settlement step %s failed", exchange.request_id, type(step).__name__)

    async def _finish(self, exchange: Exchange, outcome: str, error: GatewayError | None = None) -> None:
        """A dispatched request's end: settle, then record the outcome."""
        exchange.trace.at("settle")
        await self._settle(exchange)
        self._audit.append(OUTCOME_EVENTS[outcome], **outcome_record(exchange, outcome, error))

    async def _finish_failed(self, exchange: Exchange, error: GatewayError) -> Response:
        """A request that got no usable answer: settle what it reserved (released, or
        held pending when a provider may have done the work), record it, refuse it."""
        await self._finish(exchange, "failed", error)
        if not any(attempt["outcome"] not in UNSENT for attempt in exchange.attempts):
            await self._release(exchange)  # no provider got it: the SDK's retry is a new request
        return self._error(exchange, error, "failed")

    async def _refuse(self, exchange: Exchange, stage: str, error: GatewayError, layer: str | None = None) -> Response:
        """Refused before dispatch: what steps admitted settles (nothing was sent, so a
        reservation is released), and the refusal is recorded."""
        await self._settle(exchange)
        await self._release(exchange)
        if error.code != "auth_rate_limited":  # throttled clients would flood the log; the failures that led here are recorded
            self._audit.append("request_denied", **refusal_record(exchange, stage, error))
        return self._error(exchange, error, "refused", stage, layer)

    async def _release(self, exchange: Exchange) -> None:
        """A signed request that no provider received may come again: the SDK's retry of
        a 429 or a 5xx is signed in the same second, so it has the same signature, and
        must not be refused as a replay. One a provider received (it may have done the
        work) stays remembered: sent again, it is a replay."""
        if exchange.claim is not None:
            await self._auth.release(exchange.claim)

    def _ended(self, exchange: Exchange, status: int, outcome: str, error: GatewayError | None = None) -> None:
        log_request(exchange, status, outcome)
        self._observed(exchange, status, outcome, error)

    def _observed(self, exchange: Exchange, status: int, outcome: str, error: GatewayError | None, stage: str | None = None, layer: str | None = None) -> None:
        """The observers and the trace hear of every request once, at its end; neither
        may turn an answer into a failure."""
        for observer in self._observers:
            try:
                observer.finished(exchange, outcome, error, stage, layer)
            except Exception:
                log.exception("request %s: an observer failed", exchange.request_id)
        try:
            exchange.trace.end(exchange, status, outcome, error)
        except Exception:
            log.exception("request %s: its trace could not be ended", exchange.request_id)

    def _headers(self, exchange: Exchange) -> dict[str, str]:
        headers = {name: exchange.request_id for name in REQUEST_ID_HEADERS}
        plan, served = exchange.plan, exchange.served
        if plan is not None and served is not None and substitution(plan.resolved_model, plan.model, served.canonical_model, plan.routing):
            headers[FALLBACK_HEADER] = plan.resolved_model or ""
        return {**headers, **exchange.headers}

    def _error(self, exchange: Exchange, error: GatewayError, outcome: str, stage: str | None = None, layer: str | None = None) -> Response:
        wire = exchange.protocol.wire
        status = wire.error_status(error)
        log_request(exchange, status, error.code or error.kind.name.lower())
        self._observed(exchange, status, outcome, error, stage, layer)
        body, headers = wire.error_body(error, exchange.request_id), wire.error_headers(error, exchange.request_id)
        return error_response(body, error, exchange.request_id, headers, status)
