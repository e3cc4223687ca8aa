"""The request executor: it runs the pipeline of seed §2.2 for one request.

    1 authenticate · 2 parse · 3–4 decide (route + re-authorise every candidate, in
    Rego) · 5–6 admission steps (filters, reservations) · audit request_started ·
    7 dispatch with failover until committed · 8 response guards · 9 relay ·
    10–11 settlement steps (cost, ledger) · 12 audit the outcome

Stages that later capabilities bring (PII filters, reservations, output guards)
plug in as ``Step``s; the executor does not change shape for them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from portcullis.adapters.audit_log import AuditLog, AuditUnavailable
from portcullis.adapters.auth import Authenticator, Principal
from portcullis.adapters.bundles import BundleManager
from portcullis.adapters.config import RequestLimits
from portcullis.adapters.offload import off_loop, parse_apart
from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.jsonbody import error_message
from portcullis.adapters.protocols.registry import Route, route
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, ParsedRequest
from portcullis.adapters.protocols.sse import SSEError, SSEEvent, SSEParser
from portcullis.adapters.providers import Provider, UpstreamResponse, UpstreamUnreachable
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.streaming import RelayedStream
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.errors import ErrorKind, GatewayError, printable
from portcullis.engine.integrity.hop import HEADER as HOP_HEADER
from portcullis.engine.plan import DecisionPlan, Target
from portcullis.engine.pricing import Usage
from portcullis.engine.rego import PolicyError

if TYPE_CHECKING:
    from portcullis.adapters.governance import Metering
    from portcullis.adapters.integrity.guard import IntegrityState
    from portcullis.adapters.pii.guard import PiiState

log = logging.getLogger("portcullis.gateway")

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
FALLBACK_HEADER = "x-portcullis-model-fallback"
# Provider answers that say the request itself is wrong: another target would refuse
# it too, so they go back to the client. Any other non-2xx (overload, rate limits,
# timeouts, a target's expired credential or unknown model ID, a redirect) is about
# that target, and the next authorised one is tried.
CLIENT_ERROR_STATUS = frozenset({400, 413, 422, 431})
ERROR_CODE_HEADER = "x-portcullis-error-code"


@dataclass
class Exchange:
    """One request's state as it moves through the stages."""

    request_id: str
    protocol: WireProtocol
    started: float
    day: dt.date = field(default_factory=lambda: dt.datetime.now(dt.UTC).date())  # prices in effect for the whole request
    principal: Principal | None = None
    request: ParsedRequest | None = None
    bundle: ActiveBundle | None = None
    plan: DecisionPlan | None = None
    # Set when a hard limit governs the request: every upstream body then names an output
    # limit no larger than the target's ceiling, so the reserved bound really bounds it.
    cap_output: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    served: Target | None = None
    usage: Usage = field(default_factory=Usage)
    usage_complete: bool = False
    cost_micro_usd: int | None = None
    price_version: str | None = None
    metering: Metering | None = None  # what governance reserved and settled
    pii: PiiState | None = None  # what the PII filter assigned, for restoring the answer
    integrity: IntegrityState | None = None  # what the prompt-integrity filter did, for dispatch
    # What steps add to the request's audit records: counts and ids, never content.
    audit_started: dict[str, Any] = field(default_factory=dict)
    audit_outcome: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # what steps tell the client, on a served answer


class Step:
    """A pipeline stage that is not the executor's own. ``admit`` runs before dispatch
    (stages 5–6) and may refuse; ``settle`` runs once after the outcome is known
    (stages 10–11), whatever it was, and must not raise."""

    async def admit(self, exchange: Exchange) -> None:
        return None

    async def settle(self, exchange: Exchange) -> None:
        return None

    def outbound_headers(self, exchange: Exchange, provider: str) -> dict[str, str]:
        """Headers this step adds to the request sent to ``provider`` (never credentials)."""
        return {}

    def guards(self, exchange: Exchange, upstream: WireProtocol) -> list[ResponseGuard]:
        """Stage-8 guards for this request's answer, in the provider's protocol, in the
        order they see it."""
        return []


class ResponseGuard(Protocol):
    """Sees an answer before the client does and may change or withhold it (a
    GatewayError). Streams pass through ``events`` and may be held back in order;
    ``finish`` releases what is still held when the stream ends."""

    async def document(self, document: dict[str, Any]) -> bool: ...
    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]: ...
    async def finish(self) -> list[SSEEvent]: ...


class Gateway:
    def __init__(
        self,
        bundles: BundleManager,
        authenticator: Authenticator,
        providers: dict[str, Provider],
        pools: dict[str, KeyPool],
        audit: AuditLog,
        steps: list[Step],
        max_request_bytes: int,
        max_attempts: int,
        today: Callable[[], dt.date] = lambda: dt.datetime.now(dt.UTC).date(),
        limits: RequestLimits = DEFAULT_LIMITS,
    ) -> None:
        self._bundles = bundles
        self._auth = authenticator
        self._providers = providers
        self._pools = pools
        self._audit = audit
        self._steps = steps
        self._max_request_bytes = max_request_bytes
        self._max_attempts = max_attempts
        self._today = today
        self._limits = limits

    # --- the pipeline ------------------------------------------------------------

    async def handle(self, http: Request, protocol: WireProtocol) -> Response | RelayedStream:
        exchange = Exchange(request_id_of(http), protocol, time.monotonic())
        stage = "authenticate"
        try:
            exchange.principal = await self._auth.authenticate(http.headers, client_address(http))
            stage = "parse"
            raw = await read_body(http, self._max_request_bytes, self._limits.body_timeout_seconds)
            exchange.request = await self._parse(protocol, raw, http)
            exchange.request.session = session_of(http.headers)
            exchange.request.hop = http.headers.get(HOP_HEADER)
            stage = "decide"
            exchange.bundle = self._bundles.active  # this request's bundle, whatever reloads meanwhile
            exchange.plan = decide(exchange.bundle, exchange.principal, exchange.request)
            if not exchange.plan.allow:
                raise exchange.plan.refusal()
            stage = "admit"
            for step in self._steps:
                await step.admit(exchange)
        except GatewayError as error:
            self._record_refusal(exchange, stage, error)
            return self._error(exchange, error)
        except Exception:  # a gateway bug before dispatch: refused in the client's protocol, and recorded
            log.exception("request %s: unexpected error at stage %s", exchange.request_id, stage)
            error = GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error")
            self._record_refusal(exchange, stage, error)
            return self._error(exchange, error)
        try:
            self._audit.append_or_raise("request_started", **self._started_record(exchange))
        except AuditUnavailable:  # fail closed: nothing unaudited goes upstream
            return await self._refuse_unaudited(exchange)
        try:
            return await self._dispatch_within_deadline(exchange)
        except Exception:  # a gateway bug: the started record still gets its outcome
            log.exception("request %s: unexpected error during dispatch", exchange.request_id)
            return await self._finish_failed(exchange, GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error"))

    async def _parse(self, protocol: WireProtocol, raw: bytes, http: Request) -> ParsedRequest:
        """Stage 2. A large body is parsed and validated on a worker thread: the walk is
        pure Python, and the event loop must keep serving every other client meanwhile."""
        query = http.scope["query_string"].decode("latin-1")
        if len(raw) <= self._limits.offload_bytes:
            return protocol.wire.parse(raw, http.headers, query, self._limits)
        parsed, refusal = await off_loop(len(raw), parse_apart, protocol, raw, http.headers, query, self._limits)
        if refusal is not None:
            raise refusal
        assert parsed is not None
        return parsed

    async def _dispatch_within_deadline(self, exchange: Exchange) -> Response | RelayedStream:
        """Stage 7 within the request's total deadline (``limits.request_deadline_seconds``,
        counted from arrival): however many targets stall in turn, the client gets its
        answer started, or a 504, in bounded time."""
        deadline = asyncio.get_running_loop().time() + self._limits.request_deadline_seconds - (time.monotonic() - exchange.started)
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await self._dispatch(exchange)
        except TimeoutError:
            if not scope.expired():
                raise
            error = GatewayError(ErrorKind.TIMEOUT, "the request did not get an answer within the gateway's deadline", code="request_deadline")
            return await self._finish_failed(exchange, error)

    async def _dispatch(self, exchange: Exchange) -> Response | RelayedStream:
        """Stage 7: try authorised targets in order until one answers. Nothing has been
        sent to the client yet, so a failure here may move on to the next target."""
        assert exchange.plan is not None and exchange.request is not None
        last_error = GatewayError(ErrorKind.UPSTREAM, "no target could serve the request")
        for target in exchange.plan.targets[: self._max_attempts]:
            provider = self._providers[target.provider]
            pair = route(exchange.request.protocol, provider.protocol or exchange.request.protocol)
            try:
                body = await off_loop(len(exchange.request.raw), pair.upstream_body, exchange.request, target, exchange.cap_output)
            except GatewayError as error:  # this target cannot express the request; another might
                self._attempt(exchange, target, "unconvertible")
                last_error = error
                continue
            pool = self._pools[target.provider]
            try:
                key, wait = await pool.take(_bound_tokens(exchange))
            except StoreUnavailable:  # supply bookkeeping is down: the provider still decides
                log.warning("request %s: provider key capacity unavailable; using the first key", exchange.request_id)
                key, wait = pool.first, 0
            if key is None:  # every key of this provider is full this minute or cooling down
                self._attempt(exchange, target, "no_capacity")
                last_error = GatewayError(
                    ErrorKind.RATE_LIMITED, "the model's providers are at capacity; try again later", code="no_capacity", retry_after=wait
                )
                continue
            headers = pair.upstream.wire.upstream_headers(key.secret, exchange.request.forward_headers)  # the credential joins only here
            for step in self._steps:
                headers.update(step.outbound_headers(exchange, target.provider))
            try:
                upstream = await provider.send(pair.upstream.wire.UPSTREAM_PATH, exchange.request.query, headers, body)
            except UpstreamUnreachable as failure:
                self._attempt(exchange, target, failure.reason)
                last_error = _unreachable(failure)
                continue
            if upstream.status >= 300:
                error = await _upstream_error(upstream)
                self._attempt(exchange, target, f"status_{upstream.status}", upstream.status)
                if upstream.status == 429:
                    await _quietly(pool.cool_down(key, error.retry_after))
                if upstream.status in CLIENT_ERROR_STATUS:
                    return await self._finish_failed(exchange, error)
                last_error = error
                continue
            try:
                if exchange.request.stream:
                    return await self._relay_stream(exchange, target, pair, upstream)
                return await self._relay_body(exchange, target, pair, upstream)
            except _TryNext as retry:
                self._attempt(exchange, target, retry.reason)
                last_error = retry.error
        return await self._finish_failed(exchange, last_error)

    async def _relay_body(self, exchange: Exchange, target: Target, pair: Route, upstream: UpstreamResponse) -> Response:
        try:
            raw = await upstream.read(MAX_RESPONSE_BYTES)
            document = json.loads(raw)
        except UpstreamUnreachable as failure:
            raise _TryNext(failure.reason, _unreachable(failure)) from None
        except ValueError:
            raise _TryNext("malformed_response", GatewayError(ErrorKind.UPSTREAM, "the provider returned a malformed response")) from None
        finally:
            upstream.release()
        self._attempt(exchange, target, "ok", upstream.status)
        exchange.served = target
        usage = pair.upstream.wire.usage_of(document) if isinstance(document, dict) else None
        exchange.usage = usage or Usage()
        exchange.usage_complete = usage is not None
        try:
            for guard in self._guards(exchange, pair):
                if await guard.document(document):
                    raw = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
            body = pair.client_body(raw, document, int(time.time()))
        except GatewayError as error:  # withheld: the provider's work is still charged
            return await self._finish_failed(exchange, error)
        await self._settle(exchange)
        self._audit.append("request_finished", **self._outcome_record(exchange, "ok"))
        self._log(exchange, 200)
        return Response(body, 200, headers=self._headers(exchange), media_type="application/json")

    async def _relay_stream(self, exchange: Exchange, target: Target, pair: Route, upstream: UpstreamResponse) -> RelayedStream:
        """Read up to the first event before committing: a provider that accepts the
        stream and then fails at once (an ``error`` event first) is still a failover
        case, because the client has seen nothing yet."""
        parser = SSEParser()
        meter = pair.upstream.wire.StreamUsage()
        first: list = []
        chunks = upstream.chunks()
        try:
            while not first:
                chunk = await anext(chunks, None)
                if chunk is None:
                    first = parser.close()
                    if not first:
                        raise _TryNext("empty_stream", GatewayError(ErrorKind.UPSTREAM, "the provider closed the stream without sending anything"))
                    break
                first = parser.feed(chunk)
        except UpstreamUnreachable as failure:
            await _abandon(upstream, chunks)
            raise _TryNext(failure.reason, _unreachable(failure)) from None
        except SSEError:
            await _abandon(upstream, chunks)
            raise _TryNext("malformed_stream", GatewayError(ErrorKind.UPSTREAM, "the provider sent a malformed stream")) from None
        except _TryNext:
            await _abandon(upstream, chunks)
            raise
        if pair.upstream.wire.is_error_event(first[0]):
            await _abandon(upstream, chunks)
            raise _TryNext("error_event", GatewayError(ErrorKind.UPSTREAM, "the provider failed before streaming any output"))
        self._attempt(exchange, target, "ok", upstream.status)
        exchange.served = target
        converter = pair.stream_converter(exchange.request, int(time.time()))
        headers = {**self._headers(exchange), "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
        body = self._stream_body(exchange, pair, upstream, chunks, parser, meter, converter, first, self._guards(exchange, pair))
        opening = await anext(body, b"")  # started now, so closing it always settles and audits
        return RelayedStream(200, headers, opening, body)

    async def _stream_body(self, exchange, pair, upstream, chunks, parser, meter, converter, pending, guards) -> AsyncGenerator[bytes, None]:
        """Stages 8–9. Once the first byte is out the response is committed: from then on a
        failure ends the stream with a protocol-correct error event, never a retry.
        Usage is read off the provider's own events, before any guard sees them."""
        outcome, error = "cancelled", None
        try:
            while True:
                batch, failed = [], None
                for event in pending:
                    meter.feed(event)
                    if pair.upstream.wire.is_error_event(event):
                        failed = error_message(event.json()) or "the provider reported an error"
                        break
                    batch.append(event)
                for event in await _guarded(guards, batch):  # what came before the error still goes out
                    for out in converter.feed(event):
                        yield out
                if failed is not None:
                    raise GatewayError(ErrorKind.UPSTREAM, f"the provider failed mid-stream: {_clip(failed)}")
                chunk = await anext(chunks, None)
                if chunk is None:
                    break
                pending = parser.feed(chunk)
            closing = parser.close()
            for event in closing:
                meter.feed(event)
            if not meter.complete:
                raise GatewayError(ErrorKind.UPSTREAM, "the provider ended the stream before it completed")
            for event in await _guarded(guards, closing, finish=True):
                for out in converter.feed(event):
                    yield out
            for out in converter.finish():
                yield out
            outcome = "ok"
        except UpstreamUnreachable as failure:
            outcome, error = "failed", GatewayError(ErrorKind.UPSTREAM, f"the provider connection failed mid-stream ({failure.reason})")
            yield exchange.protocol.wire.stream_error(error)
        except (GatewayError, SSEError, ValueError) as failure:
            error = failure if isinstance(failure, GatewayError) else GatewayError(ErrorKind.UPSTREAM, "the provider sent a malformed stream")
            outcome = "failed"
            yield exchange.protocol.wire.stream_error(error)
        except Exception:  # a gateway bug mid-stream: end the stream cleanly, keep the record
            log.exception("request %s: unexpected error while relaying the stream", exchange.request_id)
            outcome, error = "failed", GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error")
            yield exchange.protocol.wire.stream_error(error)
        finally:
            await _abandon(upstream, chunks)
            exchange.usage, exchange.usage_complete = meter.usage, meter.complete and meter.known
            await self._settle(exchange)
            event = {"ok": "request_finished", "failed": "request_failed", "cancelled": "request_cancelled"}[outcome]
            record = self._outcome_record(exchange, outcome)
            if error is not None:
                record["error"] = {"kind": error.kind.name.lower(), "code": error.code}
            self._audit.append(event, **record)
            self._log(exchange, 200, outcome)

    # --- bookkeeping ---------------------------------------------------------------

    async def _settle(self, exchange: Exchange) -> None:
        """Stage 10, then the settlement steps (11). Cost is the usage the provider reported
        priced with the bundle's version in effect for the served route."""
        if exchange.served is not None and exchange.bundle is not None:
            price = exchange.bundle.price_for(exchange.served, exchange.day)
            exchange.cost_micro_usd = price.cost(exchange.usage)
            exchange.price_version = price.effective_from.isoformat()
        for step in self._steps:
            try:
                await step.settle(exchange)
            except Exception:  # settlement must never turn a served response into a failure
                log.exception("request %s: settlement step %s failed", exchange.request_id, type(step).__name__)

    def _guards(self, exchange: Exchange, pair: Route) -> list[ResponseGuard]:
        return [guard for step in self._steps for guard in step.guards(exchange, pair.upstream)]

    def _attempt(self, exchange: Exchange, target: Target, outcome: str, status: int | None = None) -> None:
        exchange.attempts.append({**target.describe(), "outcome": outcome, "status": status})

    async def _finish_failed(self, exchange: Exchange, error: GatewayError) -> Response:
        """A request that got no usable answer: settle what it reserved (released, or
        held pending when a provider may have done the work), record it, refuse it."""
        await self._settle(exchange)
        self._audit.append("request_failed", **self._outcome_record(exchange, "failed"), error={"kind": error.kind.name.lower(), "code": error.code})
        return self._error(exchange, error)

    async def _refuse_unaudited(self, exchange: Exchange) -> Response:
        """The audit log could not take the request's first record. Nothing was sent, so
        settling (no attempt, nothing served) releases the reservation; the refusal is
        held for the log like any record written while it is unavailable."""
        await self._settle(exchange)
        error = GatewayError(
            ErrorKind.UNAVAILABLE, "the gateway cannot write its audit log right now; try again shortly", code="audit_unavailable", retry_after=5
        )
        self._record_refusal(exchange, "audit", error)
        return self._error(exchange, error)

    def _record_refusal(self, exchange: Exchange, stage: str, error: GatewayError) -> None:
        if error.code == "auth_rate_limited":
            return  # throttled clients would flood the log; the failures that led here are recorded
        record: dict[str, Any] = {
            "request_id": exchange.request_id,
            "stage": stage,
            "protocol": exchange.protocol.name,
            "error": {"kind": error.kind.name.lower(), "code": error.code},
        }
        if exchange.principal is not None:
            record["principal"] = exchange.principal.as_input()
        if exchange.request is not None:
            record["requested_model"] = printable(exchange.request.model)
        if exchange.plan is not None and exchange.bundle is not None:
            record["bundle"] = {"revision": exchange.bundle.revision, "digest": exchange.bundle.digest}
            record["decision"] = exchange.plan.audit_view()
        record.update(exchange.audit_started)
        self._audit.append("request_denied", **record)

    def _started_record(self, exchange: Exchange) -> dict[str, Any]:
        assert exchange.principal and exchange.request and exchange.plan and exchange.bundle
        return {
            "request_id": exchange.request_id,
            "principal": exchange.principal.as_input(),
            "protocol": exchange.request.protocol,
            "stream": exchange.request.stream,
            "requested_model": printable(exchange.request.model),
            "model": exchange.plan.model,
            "bundle": {"revision": exchange.bundle.revision, "digest": exchange.bundle.digest},
            "decision": exchange.plan.audit_view(),
            **self._reservation_record(exchange),
            **exchange.audit_started,
        }

    @staticmethod
    def _reservation_record(exchange: Exchange) -> dict[str, Any]:
        metering = exchange.metering
        if metering is None:
            return {}
        if metering.reservation is None:
            return {"unmetered": metering.unmetered}
        bound = metering.reservation.bound
        record: dict[str, Any] = {
            "reservation": {
                "bound_tokens": bound.tokens,
                "bound_micro_usd": bound.cost_micro_usd,
                "estimate": bound.estimate,
                "counters": [charge.key for charge in metering.reservation.charges],
            }
        }
        if metering.warnings:
            record["reservation"]["warnings"] = list(metering.warnings)
        return record

    def _outcome_record(self, exchange: Exchange, outcome: str) -> dict[str, Any]:
        record: dict[str, Any] = {
            "request_id": exchange.request_id,
            "outcome": outcome,
            "attempts": exchange.attempts,
            "duration_ms": round((time.monotonic() - exchange.started) * 1000, 3),
        }
        if exchange.served is not None:
            record["served"] = exchange.served.describe()
            record["usage"] = {**exchange.usage.as_dict(), "complete": exchange.usage_complete}
            record["cost_micro_usd"] = exchange.cost_micro_usd
            record["price_version"] = exchange.price_version
            if exchange.plan is not None and exchange.served.canonical_model != exchange.plan.model:
                record["model_substituted_from"] = exchange.plan.model
        if exchange.metering is not None and exchange.metering.state is not None:
            record["settlement"] = exchange.metering.state
        record.update(exchange.audit_outcome)
        return record

    def _headers(self, exchange: Exchange) -> dict[str, str]:
        headers = {"x-portcullis-request-id": exchange.request_id, "request-id": exchange.request_id}
        plan, served = exchange.plan, exchange.served
        if plan is not None and served is not None and plan.model and served.canonical_model != plan.model:
            headers[FALLBACK_HEADER] = plan.model
        return {**headers, **exchange.headers}

    def _error(self, exchange: Exchange, error: GatewayError) -> Response:
        headers = {"x-portcullis-request-id": exchange.request_id, "request-id": exchange.request_id, ERROR_CODE_HEADER: error.error_code}
        if error.kind is ErrorKind.REQUEST_TIMEOUT:
            headers["connection"] = "close"  # the rest of a body that came too slowly is not read
        if error.retry_after is not None:
            headers["retry-after"] = str(error.retry_after)
        self._log(exchange, error.kind.status, error.code or error.kind.name.lower())
        return Response(exchange.protocol.wire.error_body(error, exchange.request_id), error.kind.status, headers=headers, media_type="application/json")

    def _log(self, exchange: Exchange, status: int, outcome: str = "ok") -> None:
        served = exchange.served
        log.info(
            "%s %s status=%d outcome=%s team=%s requested=%s model=%s served=%s duration_ms=%.1f",
            exchange.request_id,
            exchange.protocol.name,
            status,
            outcome,
            exchange.principal.team if exchange.principal else "-",
            printable(exchange.request.model) if exchange.request else "-",  # the client's own name, made safe to log
            exchange.plan.model if exchange.plan and exchange.plan.model else "-",
            f"{served.provider}/{served.model}" if served else "-",
            (time.monotonic() - exchange.started) * 1000,
        )


class _TryNext(Exception):
    def __init__(self, reason: str, error: GatewayError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


# --- helpers -------------------------------------------------------------------------


def decide(bundle: ActiveBundle, principal: Principal, request: ParsedRequest) -> DecisionPlan:
    input_document = {
        "principal": principal.as_input(),
        "request": {
            "protocol": request.protocol,
            "model": request.model,
            "stream": request.stream,
            "max_tokens": request.max_tokens,
            "requires": request.requires,
            "tools": request.tools,
        },
    }
    try:
        return bundle.decide(input_document)
    except PolicyError as error:  # a broken policy refuses; it never lets a request through
        log.error("policy evaluation failed: %s", error)
        raise GatewayError(ErrorKind.INTERNAL, "the gateway's policy could not decide this request", code="policy_error") from None


async def read_body(http: Request, limit: int, seconds: float | None = None) -> bytes:
    """Stage 2's bounds: refuse a body over ``limit`` without buffering all of it, and
    one that takes longer than ``seconds`` to arrive (a slow drip holds a
    connection and a buffer for as long as the client likes)."""
    declared = http.headers.get("content-length", "")
    too_large = GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(seconds):
            async for chunk in http.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except ClientDisconnect:
        raise GatewayError(ErrorKind.INVALID_REQUEST, "the client disconnected while sending the request", code="client_disconnected") from None
    except TimeoutError:
        raise GatewayError(ErrorKind.REQUEST_TIMEOUT, f"the request body did not arrive within {seconds:g} seconds", code="body_timeout") from None
    return await off_loop(size, b"".join, chunks)


SESSION_HEADERS = ("x-portcullis-session-id", "x-claude-code-session-id")


def session_of(headers: Mapping[str, str]) -> str | None:
    """The client's conversation id: scopes pseudonyms so they stay stable across turns.
    It only ever narrows what a principal reaches (scopes include the principal)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and len(value) <= 256 and value.isprintable():
            return value
    return None


def client_address(http: Request) -> str:
    return http.client.host if http.client else "unknown"


def request_id_of(http: Request) -> str:
    """The id the request-id middleware gave this request (one id per request, in every
    header, log line and audit record), or a new one outside it."""
    state = http.scope.get("state")
    given = state.get("request_id") if isinstance(state, dict) else None
    return given if isinstance(given, str) else new_request_id()


def new_request_id() -> str:
    # Time-ordered, so audit records sort by arrival; random tail for uniqueness.
    return f"req_{time.time_ns():x}{uuid.uuid4().hex[:12]}"


async def _upstream_error(upstream: UpstreamResponse) -> GatewayError:
    """A provider error as the client should see it. Provider-side credential and
    routing problems are the operator's to fix and are not described to the client."""
    try:
        body = json.loads(await upstream.read(1024 * 1024))
    except (UpstreamUnreachable, ValueError):
        body = None
    finally:
        upstream.release()
    status = upstream.status
    if status == 429:
        retry_after = _retry_after(upstream.headers.get("retry-after"))
        return GatewayError(
            ErrorKind.RATE_LIMITED, "the provider is rate limiting requests; try again later", code="upstream_rate_limited", retry_after=retry_after
        )
    if status in CLIENT_ERROR_STATUS:
        message = error_message(body) or f"the provider rejected the request (status {status})"
        kind = _CLIENT_ERROR_KINDS.get(status, ErrorKind.INVALID_REQUEST)
        return GatewayError(kind, f"provider: {_clip(message)}", code="upstream_invalid_request")
    if status >= 500 or status == 408:
        return GatewayError(ErrorKind.UPSTREAM, f"the provider failed (status {status})", code="upstream_error")
    log.warning("provider refused the gateway's request with status %d; check the provider's credential, base_url and model IDs", status)
    return GatewayError(ErrorKind.UPSTREAM, "the provider refused the gateway's request", code="upstream_refused")


_CLIENT_ERROR_KINDS = {413: ErrorKind.REQUEST_TOO_LARGE, 431: ErrorKind.HEADERS_TOO_LARGE}


def _bound_tokens(exchange: Exchange) -> int:
    """The tokens a request may use, for provider key capacity: the reserved bound."""
    metering = exchange.metering
    return metering.reservation.bound.tokens if metering is not None and metering.reservation is not None else 0


async def _guarded(guards: list[ResponseGuard], events: list[SSEEvent], finish: bool = False) -> list[SSEEvent]:
    """Events through every guard in order; at the end each guard also releases what it
    held, and that passes through the guards after it."""
    for guard in guards:
        events = await guard.events(events)
        if finish:
            events = [*events, *await guard.finish()]
    return events


async def _quietly(action: Awaitable[None]) -> None:
    try:
        await action
    except StoreUnavailable:
        log.warning("provider key cooldown could not be recorded")


async def _abandon(upstream: UpstreamResponse, chunks: AsyncGenerator[bytes, None]) -> None:
    """Stop reading a provider response: closing it is what stops the generation."""
    await chunks.aclose()
    upstream.release()


def _unreachable(failure: UpstreamUnreachable) -> GatewayError:
    if failure.reason == "timeout":
        return GatewayError(ErrorKind.TIMEOUT, "the provider did not answer in time", code="upstream_timeout")
    return GatewayError(ErrorKind.UPSTREAM, "the provider could not be reached", code="upstream_unreachable")


def _retry_after(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _clip(message: str, limit: int = 500) -> str:
    return message if len(message) <= limit else message[:limit] + "…"
