"""One span per request, a child span per stage, with the OpenTelemetry SDK.

The executor moves a request's ``Trace`` from stage to stage (``at``): each call ends
the open stage's span and starts the next, so the pipeline's code keeps its shape and a
disabled tracer (``NO_TRACE``, the default) costs an attribute lookup per stage. Dispatch
attempts get a span each, timed from the previous attempt's end (``attempt``).

What a span may carry is decided here, not by callers: ids, the protocol, the team, the
canonical model and served target, status, outcome and reason code, token counts and
cost. Never prompt or answer text, personal data, user ids, key ids or tool arguments:
``tests/test_served_telemetry.py`` greps every exported span for what it sent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from portcullis.adapters.telemetry.config import TracesConfig

if TYPE_CHECKING:  # the exchange carries its trace: this module must not import it at run time
    from portcullis.adapters.pipeline import Exchange
    from portcullis.engine.errors import GatewayError


class Trace:
    """A request that is not traced."""

    def at(self, stage: str) -> None:
        return None

    def attempt(self, attempt: Mapping[str, Any]) -> None:
        return None

    def end(self, exchange: Exchange, status: int, outcome: str, error: GatewayError | None = None) -> None:
        return None

    def outbound_headers(self) -> dict[str, str]:
        return {}


NO_TRACE = Trace()


class Tracer:
    """Spans exported as ``traces.exporter`` says (console or otlp); with ``none`` there
    is no tracer at all, and every request carries ``NO_TRACE``."""

    def __init__(self, config: TracesConfig, service: str = "portcullis") -> None:
        self._config = config
        self._out: IO[str] | None = None
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
        self._provider.add_span_processor(BatchSpanProcessor(self._exporter(config)))
        self._tracer = self._provider.get_tracer("portcullis")
        self._propagator = TraceContextTextMapPropagator()

    def _exporter(self, config: TracesConfig) -> Any:
        if config.exporter == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise RuntimeError("telemetry.traces.exporter otlp needs the otlp extra: pip install 'portcullis[otlp]'") from None
            return OTLPSpanExporter(endpoint=config.endpoint)
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        self._out = config.path.open("a", encoding="utf-8") if config.path is not None else None
        kwargs: dict[str, Any] = {"formatter": lambda span: span.to_json(indent=None) + "\n"}
        if self._out is not None:
            kwargs["out"] = self._out
        return ConsoleSpanExporter(**kwargs)

    def start(self, exchange: Exchange, headers: Mapping[str, str], path: str) -> Trace:
        if path.startswith("/model/"):  # Bedrock's paths carry the client's model id, which stays out
            path = f"/model/{{modelId}}/{path.rsplit('/', 1)[-1]}"
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(carrier={"traceparent": headers.get("traceparent", ""), "tracestate": headers.get("tracestate", "")})
        span = self._tracer.start_span(
            f"POST {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "portcullis.request_id": exchange.request_id,
                "portcullis.protocol": exchange.protocol.name,
                "http.request.method": "POST",
                "url.path": path,
            },
        )
        return _Traced(self, span)

    def close(self) -> None:
        self._provider.shutdown()  # exports what is still batched
        if self._out is not None:
            self._out.close()


class _Traced(Trace):
    def __init__(self, tracer: Tracer, span: Any) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._span = span
        self._context = trace.set_span_in_context(span)
        self._stage: Any = None
        self._attempt_from = time.time_ns()

    def at(self, stage: str) -> None:
        if self._stage is not None:
            self._stage.end()
        self._stage = self._tracer._tracer.start_span(stage, context=self._context)
        self._attempt_from = time.time_ns()

    def attempt(self, attempt: Mapping[str, Any]) -> None:
        now = time.time_ns()
        attributes = {
            f"portcullis.target.{name}": attempt[name] for name in ("provider", "model", "region", "canonical_model") if isinstance(attempt.get(name), str)
        }
        attributes["portcullis.attempt.outcome"] = str(attempt.get("outcome"))
        if isinstance(attempt.get("status"), int):
            attributes["http.response.status_code"] = attempt["status"]
        parent = self._context if self._stage is None else _context_of(self._stage)
        span = self._tracer._tracer.start_span(f"attempt {attempt.get('provider')}", context=parent, attributes=attributes, start_time=self._attempt_from)
        span.end(end_time=now)
        self._attempt_from = now

    def outbound_headers(self) -> dict[str, str]:
        if not self._tracer._config.propagate_to_providers:
            return {}
        carrier: dict[str, str] = {}
        self._tracer._propagator.inject(carrier, context=self._context if self._stage is None else _context_of(self._stage))
        return carrier

    def end(self, exchange: Exchange, status: int, outcome: str, error: GatewayError | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if self._stage is not None:
            self._stage.end()
            self._stage = None
        span = self._span
        span.set_attributes(_outcome_attributes(exchange, status, outcome, error))
        if error is not None and status >= 500:
            span.set_status(Status(StatusCode.ERROR, error.code or error.kind.name.lower()))
        span.end()


def _context_of(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _outcome_attributes(exchange: Exchange, status: int, outcome: str, error: GatewayError | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"http.response.status_code": status, "portcullis.outcome": outcome, "portcullis.operation": exchange.operation.value}
    if exchange.principal is not None:
        attributes["portcullis.team"] = exchange.principal.team
    if exchange.bundle is not None:
        attributes["portcullis.bundle.revision"] = exchange.bundle.revision
    if exchange.plan is not None and exchange.plan.model:
        attributes["gen_ai.request.model"] = exchange.plan.model  # the canonical model the policy resolved, not the client's text
    if exchange.served is not None:
        attributes.update(
            {
                "portcullis.served.provider": exchange.served.provider,
                "gen_ai.response.model": exchange.served.model,
                "portcullis.served.region": exchange.served.region,
            }
        )
        attributes["gen_ai.usage.input_tokens"] = exchange.usage.input_total
        attributes["gen_ai.usage.output_tokens"] = exchange.usage.output
        if exchange.cost_micro_usd is not None:
            attributes["portcullis.cost_micro_usd"] = exchange.cost_micro_usd
    if error is not None:
        attributes["error.type"] = error.code or error.kind.name.lower()
    return attributes
