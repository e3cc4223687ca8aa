"""The decision plan: the contract between the policy bundle and the adapters that
execute it (schemas/decision-plan.schema.json). Python never widens what a plan
allows; infrastructure signals only choose among the targets it authorised.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError, printable
from portcullis.engine.governance import Limits
from portcullis.engine.guardrail import Guardrail
from portcullis.engine.integrity.policy import IntegrityPolicy
from portcullis.engine.pii.policy import PiiPolicy
from portcullis.engine.routing import NO_ROUTING, Routing
from portcullis.engine.target import Target

# How a refusal reads to the client: the policy names the reason, the gateway picks the status.
_DENIAL_KINDS = {
    "unknown_model": ErrorKind.NOT_FOUND,
    "unknown_team": ErrorKind.PERMISSION,
    "model_not_allowed": ErrorKind.PERMISSION,
    "no_authorised_target": ErrorKind.PERMISSION,
    "tool_not_allowed": ErrorKind.PERMISSION,
    "guardrail_conflict": ErrorKind.PERMISSION,
    "targets_unavailable": ErrorKind.UNAVAILABLE,  # every authorised target's circuit breaker is open (L6)
}


@dataclass(frozen=True)
class DecisionPlan:
    allow: bool
    reasons: tuple[Mapping[str, str], ...]
    requested_model: str
    model: str | None
    targets: tuple[Target, ...]
    rejected_targets: tuple[Mapping[str, Any], ...]
    limits: Limits
    pii: PiiPolicy | None = None
    integrity: IntegrityPolicy | None = None
    guardrail: Guardrail | None = None  # what Bedrock targets must apply; None when nothing requires one
    suggestions: tuple[str, ...] = ()  # for an unknown model: the closest names this key may use
    routing: Routing = NO_ROUTING  # what the routing layers substituted, and what they proposed
    # What it was decided from (the input document as the policy read it, JSON) and what the
    # policy returned, as evaluated: read only by decision logs (adapters/decision_logs), and
    # kept by reference, so a plan costs nothing more to make or to cache. Never compared.
    source_input: str | None = field(default=None, repr=False, compare=False)
    source: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_policy(cls, document: Mapping[str, Any], principal: Mapping[str, Any], input_json: str | None = None) -> DecisionPlan:
        return cls(
            allow=document["allow"],
            reasons=tuple(document["reasons"]),
            requested_model=document["requested_model"],
            model=document.get("model"),
            targets=tuple(Target.from_plan(entry) for entry in document["targets"]),
            rejected_targets=tuple(document["rejected_targets"]),
            limits=Limits.from_plan(document.get("limits"), principal),
            pii=PiiPolicy.from_plan(document.get("pii")),
            integrity=IntegrityPolicy.from_plan(document.get("integrity")),
            guardrail=Guardrail.from_plan(document.get("guardrail")),
            routing=Routing.from_plan(document.get("routing")),
            source_input=input_json,
            source=document,
        )

    @property
    def resolved_model(self) -> str | None:
        """The canonical model the requested name resolved to, before any substitution."""
        return self.routing.substituted_from or self.model

    def refusal(self, now: dt.datetime | None = None) -> GatewayError:
        """The client-facing error for a plan that does not allow the request; ``now``
        dates a retry the policy names a moment for (``retry_at``, epoch seconds)."""
        reason = self.reasons[0]
        code = reason["code"]
        kind = _DENIAL_KINDS.get(code, ErrorKind.PERMISSION)
        if code == "targets_unavailable":
            retry_at = reason.get("retry_at")
            wait = max(1, math.ceil(retry_at - now.timestamp())) if isinstance(retry_at, int | float) and now is not None else None
            return GatewayError(kind, reason["message"], code=code, retry_after=wait)
        if (
            code == "no_authorised_target"
            and self.rejected_targets
            and all(reasons == ["capability_unsupported"] for reasons in (t["reasons"] for t in self.rejected_targets))
        ):
            return GatewayError(ErrorKind.INVALID_REQUEST, "the requested model does not support a feature this request uses", code="capability_unsupported")
        message = reason["message"]
        if code in ("unknown_model", "model_not_allowed"):
            message = f"{message}: {printable(self.requested_model)}; GET /v1/models lists the models this key may use"
            if self.suggestions:
                message += f" (closest: {', '.join(self.suggestions)})"
        elif code == "tool_not_allowed":  # the client's own tool names, made safe to echo
            message = f"{message}: {', '.join(printable(name) for name in reason.get('tools', [])[:5])}"
        return GatewayError(kind, message, code=code)

    def audit_view(self) -> dict[str, Any]:
        """What the audit log keeps of a decision: reasons, where each candidate stood,
        and which governance rules (and exemptions) applied."""
        view: dict[str, Any] = {
            "allow": self.allow,
            "reasons": [reason["code"] for reason in self.reasons],
            "targets": [_described(t) for t in self.targets],
            "rejected_targets": [_rejected(t) for t in self.rejected_targets],
        }
        if self.limits.counters:
            view["rules"] = sorted({rule for counter in self.limits.counters for rule in counter.rules})
        if self.limits.unlimited:
            view["unlimited"] = list(self.limits.unlimited)
        if self.pii is not None:
            view["pii_policies"] = list(self.pii.policies)
        if self.integrity is not None:
            view["integrity_policies"] = list(self.integrity.policies)
        if self.guardrail is not None:
            view["guardrail"] = self.guardrail.describe()
        if self.routing.layers:
            view["routing"] = self.routing.audit_view()
        return view


def _described(target: Target) -> str:
    """``provider/model@region``, and the whole set a cross-region profile may route to."""
    where = target.region if len(target.regions) == 1 else f"{target.region}[{','.join(target.regions)}]"
    return f"{target.provider}/{target.model}@{where}"


def _rejected(target: Mapping[str, Any]) -> dict[str, Any]:
    rejected = {"provider": target["provider"], "model": target["model"], "region": target["region"], "reasons": target["reasons"]}
    if len(target.get("regions", ())) > 1:  # a region lock refuses the whole set, not just the home region
        rejected["regions"] = list(target["regions"])
    return rejected
