"""What the gateway measures, named after the OpenTelemetry GenAI semantic conventions
where they have a name (``gen_ai.client.*``) and ``portcullis.*`` where they do not.

Everything is read off the request's exchange once it has ended (``finished``): the
audit records already hold what each stage did, in counts and names, so metrics need
no hook of their own in any step. Labels pass through ``LabelBounds``; see its docstring
for why a client-sent value never becomes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.telemetry.labels import NONE, LabelBounds
from portcullis.adapters.telemetry.registry import Labels, Registry
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.routing import substitution

# OpenTelemetry's advised boundaries (GenAI semantic conventions).
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = tuple(float(4**power) for power in range(14))  # 1, 4, 16, ... 67108864
FIRST_CHUNK_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

# gen_ai.provider.name, by the configured provider's type.
PROVIDER_NAMES = {"anthropic": "anthropic", "openai": "openai", "bedrock": "aws.bedrock", "mock": "portcullis.mock"}
# Where a refusal came from, by the stage that raised it (admission: the step's own layer).
STAGE_LAYERS = {"authenticate": "auth", "parse": "request", "decide": "policy", "audit": "audit"}
LAYERS = frozenset({"auth", "request", "policy", "rate", "routing", "pii", "integrity", "budget", "audit", "step"})
OUTCOMES = frozenset({"ok", "failed", "cancelled", "counted", "refused"})

TEAM, MODEL, PROVIDER = "portcullis.team", "gen_ai.request.model", "portcullis.provider"


class GatewayMetrics:
    def __init__(
        self, registry: Registry, provider_types: Mapping[str, str], active_bundle: Callable[[], Any], open_breakers: Callable[[], Mapping[str, str]]
    ) -> None:
        self.registry = registry
        self._bounds = LabelBounds(provider_types)
        self._provider_names = {name: PROVIDER_NAMES.get(kind, kind) for name, kind in provider_types.items()}
        self._active_bundle = active_bundle
        self._open_breakers = open_breakers
        r = registry
        self.requests = r.counter(
            "portcullis.requests",
            "{request}",
            "Requests by protocol, outcome and reason code",
            ("protocol", "operation", TEAM, MODEL, PROVIDER, "outcome", "reason"),
        )
        self.refusals = r.counter("portcullis.refusals", "{request}", "Requests refused before dispatch, by layer and reason code", ("layer", "reason", TEAM))
        self.duration = r.histogram(
            "gen_ai.client.operation.duration",
            "s",
            "Time from a request's arrival until its answer ended",
            ("gen_ai.operation.name", "gen_ai.provider.name", MODEL, TEAM, "error.type"),
            DURATION_BUCKETS,
        )
        self.tokens = r.histogram(
            "gen_ai.client.token.usage",
            "{token}",
            "Tokens a served request used, as the provider reported them",
            ("gen_ai.operation.name", "gen_ai.provider.name", MODEL, TEAM, "gen_ai.token.type"),
            TOKEN_BUCKETS,
        )
        self.first_chunk = r.histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            "s",
            "Time from a streamed request's arrival to its first chunk: from the provider (upstream) and as the client got it after the guards (client)",
            ("gen_ai.provider.name", MODEL, TEAM, "portcullis.measured_at"),
            FIRST_CHUNK_BUCKETS,
        )
        self.cost = r.counter(
            "portcullis.cost.micro_usd", "{micro_usd}", "What served requests cost, priced by the bundle, in micro-USD", (TEAM, MODEL, PROVIDER)
        )
        self.substitutions = r.counter(
            "portcullis.model.substitutions",
            "{request}",
            "Requests served by another model than the one resolved, by routing layer",
            (TEAM, "layer", "from", "to"),
        )
        self.attempts = r.counter(
            "portcullis.upstream.attempts", "{attempt}", "Dispatch attempts by target and outcome", (PROVIDER, MODEL, "region", "outcome")
        )
        self.pii_found = r.counter("portcullis.pii.findings", "{finding}", "Personal data found in prompts, by entity type", (TEAM, "entity"))
        self.pii_actions = r.counter("portcullis.pii.actions", "{finding}", "What the PII policies did with what they found, by action", (TEAM, "action"))
        self.injections = r.counter(
            "portcullis.injection.findings",
            "{request}",
            "Requests in which the injection scanner found something, by surface and action",
            (TEAM, "surface", "action"),
        )
        self.settlements = r.counter(
            "portcullis.settlements",
            "{request}",
            "How metered requests settled: settled, pending (the provider may have done the work), released",
            (TEAM, "state"),
        )
        self.tool_denials = r.counter("portcullis.tool_calls.denied", "{call}", "Tool calls denied in answers, by rule", (TEAM, "rule"))
        r.gauge("portcullis.bundle.active", "{bundle}", "The active bundle's revision and digest (value 1)", ("revision", "digest"), self._bundle_info)
        r.gauge(
            "portcullis.breaker.state", "{breaker}", "Circuit breakers that are not closed, by target and state (value 1)", ("target", "state"), self._breakers
        )

    # --- one request ---------------------------------------------------------------------

    def finished(self, exchange: Exchange, outcome: str, error: GatewayError | None = None, stage: str | None = None, layer: str | None = None) -> None:
        bounds = self._bounds.for_bundle(exchange.bundle)
        plan, served, principal = exchange.plan, exchange.served, exchange.principal
        team = bounds.team(principal.team if principal is not None else None)
        model = bounds.model(plan.model if plan is not None else None)
        provider = bounds.provider(served.provider if served is not None else None)
        reason = bounds.named("reason", error.code or error.kind.name.lower()) if error is not None else NONE
        operation = exchange.operation.value
        self.requests.add((exchange.protocol.name, operation, team, model, provider, outcome, reason))
        if outcome == "refused":
            where = layer if stage == "admit" and layer else STAGE_LAYERS.get(stage or "", "step")
            if where == "budget" and error is not None and error.kind == ErrorKind.RATE_LIMITED:
                where = "rate"  # governance judges both: windows refuse as rate, budgets as budget
            self.refusals.add((LabelBounds.one_of(where, LAYERS), reason, team))
        self._audited(exchange, bounds, team)
        if outcome in ("refused", "counted"):
            return
        gen_ai_provider = self._provider_names.get(served.provider, NONE) if served is not None else NONE
        elapsed = time.monotonic() - exchange.started
        self.duration.record(("chat", gen_ai_provider, model, team, reason), elapsed)
        for attempt in exchange.attempts:
            values = (bounds.provider(attempt.get("provider")), bounds.model(attempt.get("canonical_model")), bounds.region(attempt.get("region")))
            self.attempts.add((*values, bounds.named("attempt", attempt.get("outcome"))))
        if served is None:
            return
        usage = exchange.usage
        for kind, count in (("input", usage.input_total), ("output", usage.output)):
            if count:
                self.tokens.record(("chat", gen_ai_provider, model, team, kind), count)
        if exchange.cost_micro_usd:
            self.cost.add((team, model, provider), exchange.cost_micro_usd)
        for measured_at, at in (("upstream", exchange.first_upstream_at), ("client", exchange.first_client_at)):
            if at is not None:
                self.first_chunk.record((gen_ai_provider, model, team, measured_at), at - exchange.started)
        if plan is not None:
            substituted = substitution(plan.resolved_model, plan.model, served.canonical_model, plan.routing)
            if substituted:
                resolved, layer_name = substituted
                self.substitutions.add((team, bounds.named("routing_layer", layer_name), bounds.model(resolved), bounds.model(served.canonical_model)))

    def _audited(self, exchange: Exchange, bounds: LabelBounds, team: str) -> None:
        """What the PII and integrity steps wrote into the audit records, as counts."""
        pii = exchange.audit_started.get("pii") or {}
        for entity, count in (pii.get("found") or {}).items():
            self.pii_found.add((team, bounds.named("entity", entity)), count)
        for action, count in (pii.get("actions") or {}).items():
            self.pii_actions.add((team, bounds.named("pii_action", action)), count)
        integrity = exchange.audit_started.get("integrity") or {}
        injection = integrity.get("injection") or {}
        for surface in injection.get("findings") or {}:
            self.injections.add((team, bounds.named("surface", surface), bounds.named("injection_action", injection.get("action"))))
        settlement = exchange.audit_outcome.get("settlement")
        if settlement is not None:
            self.settlements.add((team, bounds.named("settlement", settlement)))
        for denial in (exchange.audit_outcome.get("integrity") or {}).get("tool_calls_denied") or ():
            self.tool_denials.add((team, bounds.named("tool_rule", denial.get("rule"))))

    # --- gauges ------------------------------------------------------------------------------

    def _bundle_info(self) -> Iterable[tuple[Labels, float]]:
        bundle = self._active_bundle()
        return [((bundle.revision, bundle.digest[:12]), 1)] if bundle is not None else []

    def _breakers(self) -> Iterable[tuple[Labels, float]]:
        return [((self._bounds.named("breaker_target", target), state), 1) for target, state in sorted(self._open_breakers().items())]
