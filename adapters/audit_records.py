"""The audit records of one request, and its log line, built from its exchange: who asked, what the
policy decided under which bundle, what was tried and served, what it cost. Counts,
names and ids only — never a prompt, an answer or a credential. What steps add
(``audit_started`` / ``audit_outcome``) is merged in as they wrote it."""

from __future__ import annotations

import logging
import time
from typing import Any

from portcullis.adapters.operations import Operation
from portcullis.adapters.pipeline import Exchange
from portcullis.engine.errors import GatewayError, printable
from portcullis.engine.routing import substitution

log = logging.getLogger("portcullis.gateway")


def error_of(error: GatewayError) -> dict[str, Any]:
    return {"kind": error.kind.name.lower(), "code": error.code}


def refusal_record(exchange: Exchange, stage: str, error: GatewayError) -> dict[str, Any]:
    """``request_denied``: refused at ``stage``, before anything went upstream."""
    record: dict[str, Any] = {"request_id": exchange.request_id, "stage": stage, "protocol": exchange.protocol.name, "error": error_of(error)}
    record.update(_operation(exchange))
    if exchange.principal is not None:
        record["principal"] = exchange.principal.as_input()
    if exchange.request is not None:
        record["requested_model"] = printable(exchange.request.model)
    if exchange.plan is not None and exchange.bundle is not None:
        record["decision_id"] = exchange.request_id  # the decision log's event (docs/operations.md#decision-logs)
        record["bundle"] = {"revision": exchange.bundle.revision, "digest": exchange.bundle.digest}
        record["decision"] = decision_view(exchange)
    record.update(exchange.audit_started)
    if "charged_micro_usd" in exchange.audit_outcome:  # sub-calls it made before it was refused (a classifier's guess)
        record["charged_micro_usd"] = exchange.audit_outcome["charged_micro_usd"]
    return record


def decision_view(exchange: Exchange) -> dict[str, Any]:
    """The plan's audit view, with the targets steps turned away after it (too small a
    context window, ...) listed after the ones the policy rejected."""
    assert exchange.plan is not None
    view = exchange.plan.audit_view()
    if exchange.rejected_targets:
        view["rejected_targets"] = [*view["rejected_targets"], *exchange.rejected_targets]
    return view


def started_record(exchange: Exchange) -> dict[str, Any]:
    """``request_started``: admitted, about to be dispatched."""
    assert exchange.principal and exchange.request and exchange.plan and exchange.bundle
    return {
        "request_id": exchange.request_id,
        "principal": exchange.principal.as_input(),
        "protocol": exchange.request.protocol,
        "stream": exchange.request.stream,
        **_operation(exchange),
        "requested_model": printable(exchange.request.model),
        "model": exchange.plan.model,
        "decision_id": exchange.request_id,  # the decision log's event (docs/operations.md#decision-logs)
        "bundle": {"revision": exchange.bundle.revision, "digest": exchange.bundle.digest},
        "decision": decision_view(exchange),
        **exchange.audit_started,
    }


def outcome_record(exchange: Exchange, outcome: str, error: GatewayError | None = None) -> dict[str, Any]:
    """``request_finished`` / ``request_failed`` / ``request_cancelled``."""
    record: dict[str, Any] = {
        "request_id": exchange.request_id,
        "outcome": outcome,
        **_operation(exchange),
        "attempts": exchange.attempts,
        "duration_ms": round((time.monotonic() - exchange.started) * 1000, 3),
    }
    if exchange.served is not None:
        record["served"] = exchange.served.describe()
        record["usage"] = {**exchange.usage.as_dict(), "complete": exchange.usage_complete}
        record["cost_micro_usd"] = exchange.cost_micro_usd
        record["price_version"] = exchange.price_version
        plan = exchange.plan
        substituted = plan and substitution(plan.resolved_model, plan.model, exchange.served.canonical_model, plan.routing)
        if substituted:
            record["model_substituted_from"], record["substitution_layer"] = substituted
    record.update(exchange.audit_outcome)
    if error is not None:
        record["error"] = error_of(error)
    return record


# A count ends in its own event: nothing was generated, so it is never read as spend.
OUTCOME_EVENTS = {"ok": "request_finished", "failed": "request_failed", "cancelled": "request_cancelled", "counted": "tokens_counted"}


def _operation(exchange: Exchange) -> dict[str, str]:
    """Records of inference stay as they always were; any other operation says which it was."""
    return {} if exchange.operation == Operation.INFERENCE else {"operation": exchange.operation.value}


def log_request(exchange: Exchange, status: int, outcome: str = "ok") -> None:
    """The request's one log line: ids, names and timing, never content."""
    if not log.isEnabledFor(logging.INFO):  # its arguments are not worth building for a line nobody keeps
        return
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
