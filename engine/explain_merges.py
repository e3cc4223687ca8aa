"""Which policy contributed what to a plan's merged parts (``portcullis policy eval``):
the governance rules behind each counter's limits, and the PII and integrity policies
behind each merged action.

The merged values are the plan's, as the bundle merged them (governance.rego, pii.rego,
integrity.rego); only the attribution is worked out here, by setting each applying
rule's or policy's own value, as its data writes it, beside the merged one: the rules
whose limit equals a counter's block limit govern it, the policies whose action equals
the merged action set it. The Rego exposes no per-source values (they are locals of
its merge functions), and rules added to the shipped policies for this would sit in
the bundle the gateway loads; reading the data costs the request path nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from portcullis.engine.governance import fill_scope

# governance.rego _rule_limits: where a rule writes each (metric, period) limit.
_PERIODS = {"CalendarMonth": "month", "CalendarDay": "day"}
_EFFECTIVE = {
    "requests_per_minute": ("requests", "minute"),
    "tokens_per_minute": ("tokens", "minute"),
    "tokens_per_day": ("tokens", "day"),
    "usd_per_day": ("cost", "day"),
    "usd_per_month": ("cost", "month"),
}
_DEFAULT_MIN_SCORE = 0.6  # pii.rego's default
_DEFAULT_THRESHOLD = 3  # integrity.rego's default injection threshold


def own_limit(rule: Mapping[str, Any], metric: str, period: str) -> Any:
    """The limit ``rule`` itself sets on (metric, period), as written; None if it sets none."""
    if metric == "requests" and period == "minute":
        return (rule.get("rate") or {}).get("rpm")
    if metric == "tokens" and period == "minute":
        return (rule.get("rate") or {}).get("tpm")
    if metric == "tokens" and period == "day":
        return (rule.get("quota") or {}).get("tokens_per_day")
    budget = rule.get("budget") or {}
    if metric == "cost" and _PERIODS.get(budget.get("period")) == period:
        return budget.get("limit_usd")
    return None


def _number(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value)) if value is not None else None
    except InvalidOperation:
        return None


def limits_explanation(governance: Mapping[str, Any] | None, limits: Mapping[str, Any] | None, principal: Mapping[str, Any]) -> dict[str, Any]:
    """Each counter with every rule merged into it, its own limit and its part: governs
    (the lowest Block limit), warns (the lowest Warn limit below it), or looser."""
    rules = (governance or {}).get("rules") or {}
    limits = limits or {}
    counters = []
    for counter in limits.get("counters") or []:
        entries = []
        for name in counter.get("rules") or []:
            rule = rules.get(name) or {}
            limit = own_limit(rule, counter["metric"], counter["period"])
            policy = rule.get("failure_policy", "Block")
            entries.append({"rule": name, "limit": limit, "policy": policy, "part": _part(policy, limit, counter)})
        counters.append(
            {
                "scope": fill_scope(counter["scope"], principal),
                "metric": counter["metric"],
                "period": counter["period"],
                "block": counter.get("block"),
                "warn": counter.get("warn"),
                "hard": counter.get("hard"),
                "thresholds": counter.get("thresholds") or [],
                "governed_by": [entry["rule"] for entry in entries if entry["part"] == "governs"],
                "warned_by": [entry["rule"] for entry in entries if entry["part"] == "warns"],
                "rules": entries,
            }
        )
    effective = {}
    for label, limit in (limits.get("effective") or {}).items():
        metric, period = _EFFECTIVE.get(label, (None, None))
        sources = [c for c in counters if c["metric"] == metric and c["period"] == period and _number(c["block"]) == _number(limit)]
        effective[label] = {"limit": limit, "counters": [c["scope"] for c in sources], "rules": sorted({r for c in sources for r in c["governed_by"]})}
    return {"counters": counters, "effective": effective, "unlimited": list(limits.get("unlimited") or [])}


def _part(policy: str, limit: Any, counter: Mapping[str, Any]) -> str:
    value, block, warn = _number(limit), _number(counter.get("block")), _number(counter.get("warn"))
    if value is None:
        return "sets no limit here"
    if policy == "Block":
        return "governs" if value == block else "looser"
    if warn is not None and value == warn:
        return "warns"
    if block is not None and value >= block:
        return "warns no sooner than the block limit: ignored"
    return "looser"


def _sources(proposals: Mapping[str, Any], merged: Any) -> list[str]:
    return [name for name, value in proposals.items() if value == merged]


def pii_explanation(pii_data: Mapping[str, Any] | None, pii: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The PII policies that apply (the plan's ``pii.policies``) and, per merged setting,
    each policy's own value and the policies the merged value came from."""
    if pii is None:
        return None
    defined = (pii_data or {}).get("policies") or {}
    names = list(pii.get("policies") or [])
    own = {name: defined.get(name) or {} for name in names}
    actions = {}
    for entity, merged in sorted((pii.get("actions") or {}).items()):
        proposals = {name: policy["actions"][entity] for name, policy in own.items() if entity in (policy.get("actions") or {})}
        actions[entity] = {"action": merged, "from": _sources(proposals, merged), "proposed": proposals}
    scores = {name: policy.get("min_score", _DEFAULT_MIN_SCORE) for name, policy in own.items()}
    on_error = {name: policy.get("on_error", "fail_closed") for name, policy in own.items()}
    unsupported = {name: ((policy.get("scope") or {}).get("unsupported_sensitive_content", "block")) for name, policy in own.items()}
    return {
        "policies": names,
        "not_applying": sorted(set(defined) - set(names)),
        "actions": actions,
        "detectors": {d: [n for n, p in own.items() if d in (p.get("detectors") or [])] or ["always"] for d in pii.get("detectors") or []},
        "min_score": {"value": pii.get("min_score"), "from": [n for n, s in scores.items() if _number(s) == _number(pii.get("min_score"))]},
        "on_error": {"value": pii.get("on_error"), "from": _sources(on_error, pii.get("on_error"))},
        "unsupported": {"value": pii.get("unsupported"), "from": _sources(unsupported, pii.get("unsupported"))},
        "fields": pii.get("fields") or [],
        "restore_tokens": pii.get("restore_tokens"),
    }


def integrity_explanation(integrity_data: Mapping[str, Any] | None, integrity: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The integrity policies that apply and, per merged surface, finding and tool rule,
    each policy's own setting and those the merged one came from."""
    if integrity is None:
        return None
    defined = (integrity_data or {}).get("policies") or {}
    names = list(integrity.get("policies") or [])
    own = {name: defined.get(name) or {} for name in names}
    injection = integrity.get("injection") or {}
    surfaces = {}
    for surface, merged in sorted((injection.get("surfaces") or {}).items()):
        proposals = {n: p["injection"]["surfaces"][surface] for n, p in own.items() if surface in ((p.get("injection") or {}).get("surfaces") or {})}
        thresholds = {n: (own[n].get("injection") or {}).get("threshold", _DEFAULT_THRESHOLD) for n in proposals}
        threshold = (injection.get("thresholds") or {}).get(surface)
        surfaces[surface] = {
            "action": merged,
            "from": _sources(proposals, merged),
            "proposed": proposals,
            "threshold": {"value": threshold, "from": _sources(thresholds, threshold)},
        }
    output = {}
    for finding, merged in sorted(((integrity.get("output") or {}).get("actions") or {}).items()):
        proposals = {n: p["output"]["actions"][finding] for n, p in own.items() if finding in ((p.get("output") or {}).get("actions") or {})}
        output[finding] = {"action": merged, "from": _sources(proposals, merged), "proposed": proposals}
    tools = integrity.get("tools") or {}
    deny = {rule: [n for n, p in own.items() if rule in ((p.get("tools") or {}).get("deny") or [])] for rule in tools.get("deny") or []}
    prompt = integrity.get("prompt")
    return {
        "policies": names,
        "not_applying": sorted(set(defined) - set(names)),
        "injection": surfaces,
        "output": output,
        "tools": {
            "allow": {n: (p.get("tools") or {}).get("allow") for n, p in own.items() if (p.get("tools") or {}).get("allow")},
            "deny": deny,
            "declared_only": {"value": tools.get("declared_only"), "from": [n for n, p in own.items() if (p.get("tools") or {}).get("declared_only")]},
        },
        "prompt": prompt.get("version") if isinstance(prompt, Mapping) else None,
        "spotlight": {s: [n for n, p in own.items() if s in (p.get("spotlight") or [])] for s in integrity.get("spotlight") or []},
    }
