"""Why a bundle decided what it did for one input document (``portcullis policy eval``).

Nothing here runs on the request path: the gateway evaluates ``data.portcullis.decision``
and nothing else. The explanation is read off that rule's plan plus the intermediate
rules the decision is composed of, each evaluated again by the bundle for the same
input (``Policy.query``): ``access.resolve`` and ``access.entitlements`` (L1, L2),
``guardrails.required``, ``routing.candidates`` and ``integrity.tools_refused``. What
a check concluded always comes from the bundle (the plan's reason codes, those rules'
values); Python only lines the results up against the input and the bundle's data, in
the order ``decision.rego`` checks them, so no decision is computed twice in two
languages. Merged limits, PII and integrity policies are in ``engine/explain_merges.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from portcullis.engine.explain_merges import integrity_explanation, limits_explanation, pii_explanation
from portcullis.engine.rego import Policy, PolicyError
from portcullis.engine.routing import Routing, substitution

RESOLVE = "data.portcullis.access.resolve(input.request.model)"
ENTITLEMENTS = "data.portcullis.access.entitlements(input.principal)"
GUARDRAILS = "data.portcullis.guardrails.required(input.principal.team, input.model)"
CANDIDATES = "data.portcullis.routing.candidates(input.model)"
TOOLS_REFUSED = "data.portcullis.integrity.tools_refused(input.integrity, input.tools)"

# Which rule of decision.rego each reason code comes from, and the check it answers.
DECIDING_RULES = {
    "unknown_team": ("team", "data.portcullis.decision: the team is not in data.portcullis.tenants.teams"),
    "unknown_model": ("model", "data.portcullis.decision: data.portcullis.access.resolve is undefined for the name"),
    "model_not_allowed": ("grant", "data.portcullis._authorisation: the model is not in data.portcullis.access.entitlements"),
    "guardrail_conflict": ("guardrail", "data.portcullis._authorisation: data.portcullis.guardrails.required says conflict"),
    "targets_unavailable": ("targets", "data.portcullis._authorisation: data.portcullis.breakers.available left no target"),
    "no_authorised_target": ("targets", "data.portcullis._authorisation: data.portcullis._serve authorised no candidate"),
    "tool_not_allowed": ("tools", "data.portcullis._authorisation: data.portcullis.integrity.tools_refused is not empty"),
    "allowed": (None, "data.portcullis._authorisation: every check passed"),
}


def explain(
    policy: Policy,
    data: Mapping[str, Any],
    input_document: Mapping[str, Any],
    plan: Mapping[str, Any],
    fit: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The explanation of ``plan`` (the decision rule's document for ``input_document``);
    ``data``: the bundle's data.portcullis. ``fit``: the context-fit verdict (L5, decided
    after the plan) of each plan target, in order, when the request's body was there to
    size; None otherwise."""
    principal = input_document.get("principal") or {}
    request = input_document.get("request") or {}
    facts = input_document.get("facts") or {}
    resolved = _query(policy, RESOLVE, input_document)
    granted = _query(policy, ENTITLEMENTS, input_document) if resolved is not None else None
    checks = _checks(policy, data, input_document, plan, resolved, granted)
    code = plan["reasons"][0]["code"]
    check, rule = DECIDING_RULES.get(code, (None, "data.portcullis.decision"))
    candidates = _candidates(policy, plan, granted, request, facts, fit)
    return {
        "decided_by": {"code": code, "message": plan["reasons"][0].get("message"), "rule": rule, "check": check},
        "checks": checks,
        "targets": candidates,
        "routing": _routing(policy, data, plan, facts, candidates),
        "limits": limits_explanation(data.get("governance"), plan.get("limits"), principal),
        "pii": pii_explanation(data.get("pii"), plan.get("pii")),
        "integrity": integrity_explanation(data.get("integrity"), plan.get("integrity")),
        "principal": _who(principal),
    }


def _query(policy: Policy, expression: str, input_document: Mapping[str, Any]) -> Any:
    """A rule of the bundle's, or None when it has no such rule (a bundle of another shape)."""
    try:
        return policy.query(expression, input_document)
    except PolicyError:
        return None


def _who(principal: Mapping[str, Any]) -> str:
    user = principal.get("user")
    return f"{principal.get('team')}/{user}" if user is not None else str(principal.get("team"))


def _check(name: str, rule: str, passed: bool | None, detail: str) -> dict[str, Any]:
    return {"check": name, "rule": rule, "passed": passed, "detail": detail}


def _checks(policy: Policy, data: Mapping[str, Any], document: Mapping[str, Any], plan: Mapping[str, Any], resolved: Any, granted: Any) -> list[dict[str, Any]]:
    """decision.rego's checks in its order, each with what the bundle's rule said."""
    principal, request = document.get("principal") or {}, document.get("request") or {}
    teams = ((data.get("tenants") or {}).get("teams")) or {}
    team, name = principal.get("team"), request.get("model")
    checks = [_team_check(teams, team), _model_check(data, name, resolved, plan)]
    if team not in teams or resolved is None:
        return checks
    checks.append(_grant_check(policy, teams[team], document, resolved, granted))
    guardrails = _query(policy, GUARDRAILS, {"principal": principal, "model": plan.get("model") or resolved}) or {}
    checks.append(_guardrail_check(guardrails))
    checks.append(_targets_check(plan))
    checks.append(_tools_check(policy, data, plan, request))
    return checks


def _team_check(teams: Mapping[str, Any], team: Any) -> dict[str, Any]:
    rule = "data.portcullis.tenants.teams"
    if team in teams:
        return _check("team", rule, True, f"team {team!r} is defined")
    return _check("team", rule, False, f"team {team!r} is not defined; the bundle's teams: {', '.join(sorted(teams)[:20]) or '(none)'}")


def _model_check(data: Mapping[str, Any], name: Any, resolved: Any, plan: Mapping[str, Any]) -> dict[str, Any]:
    rule = "data.portcullis.access.resolve"
    if resolved is None:
        return _check("model", rule, False, f"{name!r} is neither an alias (catalog.aliases) nor a model (catalog.models)")
    aliases = (data.get("catalog") or {}).get("aliases") or {}
    how = f"alias of {resolved}" if name in aliases else "a canonical model"
    return _check("model", rule, True, f"{name!r} is {how}")


def _grant_check(policy: Policy, team: Mapping[str, Any], document: Mapping[str, Any], model: str, granted: Any) -> dict[str, Any]:
    rule = "data.portcullis.access.entitlements"
    principal = document.get("principal") or {}
    who = _who(principal)
    team_patterns = list(team.get("models") or [])
    user = principal.get("user")
    user_entry = (team.get("users") or {}).get(user) if user is not None else None
    user_patterns = list(user_entry["models"]) if isinstance(user_entry, Mapping) and "models" in user_entry else None
    models = (granted or {}).get("models") or {}
    if model in models:
        narrowed = f", narrowed by user {user}'s {user_patterns}" if user_patterns is not None else ""
        return _check("grant", rule, True, f"{model} is granted to {who} by the team's {team_patterns}{narrowed}")
    if user is not None:
        team_level = _query(policy, ENTITLEMENTS, {"principal": {**principal, "user": None}}) or {}
        if model in (team_level.get("models") or {}):
            detail = f"team {principal.get('team')} grants {model} ({team_patterns}), but user {user}'s {user_patterns} narrows it out"
            return _check("grant", rule, False, detail)
    return _check("grant", rule, False, f"{model} matches none of team {principal.get('team')}'s model patterns {team_patterns}")


def _guardrail_check(guardrails: Mapping[str, Any]) -> dict[str, Any]:
    rule = "data.portcullis.guardrails.required"
    if guardrails.get("conflict"):
        return _check("guardrail", rule, False, "the team and the model require different Bedrock guardrails")
    guardrail = guardrails.get("guardrail")
    if guardrail:
        return _check("guardrail", rule, True, f"guardrail {guardrail.get('identifier')} version {guardrail.get('version')} applies")
    return _check("guardrail", rule, True, "no guardrail is required")


def _targets_check(plan: Mapping[str, Any]) -> dict[str, Any]:
    rule = "data.portcullis._serve, data.portcullis.breakers.available"
    kept, rejected = len(plan.get("targets") or []), len(plan.get("rejected_targets") or [])
    if kept:
        return _check("targets", rule, True, f"{kept} of {kept + rejected} candidates authorised")
    if plan["reasons"][0]["code"] == "targets_unavailable":
        return _check("targets", rule, False, f"every permitted candidate's circuit breaker is open (retry at {plan['reasons'][0].get('retry_at')})")
    return _check("targets", rule, False, f"every candidate ({rejected}) rejected (see the targets)")


def _tools_check(policy: Policy, data: Mapping[str, Any], plan: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    rule = "data.portcullis.integrity.tools_refused"
    tools = list(request.get("tools") or [])
    integrity = plan.get("integrity")
    if not tools:
        return _check("tools", rule, True, "the request offers no tools")
    if integrity is None:
        return _check("tools", rule, True, f"no integrity policy applies to the tools offered ({len(tools)})")
    policies = ((data.get("integrity") or {}).get("policies")) or {}
    refusals = []
    for name in integrity.get("policies") or []:  # each policy's own allow-list, judged by the bundle's rule
        own = (policies.get(name) or {}).get("tools") or {}
        view = {"tools": {"allow": [own["allow"]] if own.get("allow") else [], "deny": own.get("deny") or [], "declared_only": bool(own.get("declared_only"))}}
        refused = _query(policy, TOOLS_REFUSED, {"integrity": view, "tools": tools}) or []
        if refused:
            refusals.append(f"policy {name} refuses {', '.join(refused)} (allow: {own.get('allow')})")
    if refusals:
        return _check("tools", rule, False, "; ".join(refusals))
    return _check("tools", rule, True, f"every tool offered ({len(tools)}) passes the allow-lists of {', '.join(integrity.get('policies') or [])}")


def target_id(target: Mapping[str, Any]) -> str:
    """``provider/model@region``: how the breakers name a target (engine/breakers.py)."""
    return f"{target.get('provider')}/{target.get('model')}@{target.get('region')}"


def _key(target: Mapping[str, Any]) -> tuple[Any, ...]:
    return (target.get("canonical_model"), target.get("provider"), target.get("model"), target.get("region"))


def _candidates(
    policy: Policy,
    plan: Mapping[str, Any],
    granted: Any,
    request: Mapping[str, Any],
    facts: Mapping[str, Any],
    fit: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, Any]]:
    """Every candidate of the plan's model, in the bundle's order: kept (and where the
    gateway would try it) or rejected, and each check it passed or failed."""
    model = plan.get("model")
    if model is None:
        return []
    candidates = _query(policy, CANDIDATES, {"model": model}) or []
    kept = {_key(target): order for order, target in enumerate(plan.get("targets") or [])}
    rejected = {_key(target): list(target.get("reasons") or []) for target in plan.get("rejected_targets") or []}
    rows = []
    for position, candidate in enumerate(candidates, start=1):
        key = _key(candidate)
        order = kept.get(key)
        reasons = rejected.get(key, [])
        verdict = fit[order] if fit is not None and order is not None and order < len(fit) else None
        if verdict is not None and not verdict.get("fits"):
            reasons = list(verdict.get("reasons") or ["context_exceeded"])
        status = "rejected" if reasons else ("not listed" if order is None else ("kept" if plan.get("allow") else "passed, but the request is refused"))
        rows.append(
            {
                "position": position,
                "target": target_id(candidate),
                "canonical_model": candidate.get("canonical_model"),
                "via": "own" if candidate.get("canonical_model") == model else "fallback",
                "priority": candidate.get("priority"),
                "status": status,
                "order": order + 1 if order is not None else None,
                "reasons": reasons,
                "checks": _target_checks(candidate, rejected.get(key, []), granted, request, facts, verdict),
            }
        )
    return rows


def _target_checks(
    candidate: Mapping[str, Any],
    reasons: Sequence[str],
    granted: Any,
    request: Mapping[str, Any],
    facts: Mapping[str, Any],
    verdict: Mapping[str, Any] | None,
) -> dict[str, dict[str, Any]]:
    """Each of the decision's checks on one candidate: it failed when the plan names its
    reason code for the candidate, passed otherwise; with the values it was judged on."""
    lock = (granted or {}).get("regions")
    regions = list(candidate.get("regions") or [candidate.get("region")])
    needed = list(request.get("requires") or [])
    capabilities = list(candidate.get("capabilities") or [])
    state = ((facts.get("breakers") or {}).get(target_id(candidate)) or {}).get("state", "closed")
    checks = {
        "grant": {
            "passed": "model_not_allowed" not in reasons,
            "detail": f"{candidate.get('canonical_model')} {'not ' if 'model_not_allowed' in reasons else ''}in the principal's entitlements",
        },
        "region": {
            "passed": "region_not_allowed" not in reasons,
            "detail": f"{regions} {'not all ' if 'region_not_allowed' in reasons else ''}within the lock {sorted(lock)}"
            if lock is not None
            else f"{regions}, no region lock",
        },
        "capability": {
            "passed": "capability_unsupported" not in reasons,
            "detail": f"needs {needed}, has {capabilities}" if needed else "the request needs no capability",
            "missing": [capability for capability in needed if capability not in capabilities],
        },
        "guardrail": {"passed": "guardrail_conflict" not in reasons, "detail": "its model's guardrail requirement against the plan's"},
        "breaker": {"passed": "breaker_open" not in reasons, "detail": _breaker_detail(state, facts, candidate)},
    }
    if verdict is not None:
        checks["context_fit"] = {"passed": bool(verdict.get("fits")), "detail": _fit_detail(verdict)}
    return checks


def _breaker_detail(state: str, facts: Mapping[str, Any], candidate: Mapping[str, Any]) -> str:
    if state == "open":
        until = ((facts.get("breakers") or {}).get(target_id(candidate)) or {}).get("until")
        return f"open until {until}"
    return "half-open: one probe goes" if state == "half_open" else "closed (no facts.breakers entry)"


def _fit_detail(verdict: Mapping[str, Any]) -> str:
    if verdict.get("screened"):
        return f"admitted by the bundle's screen ({verdict.get('input_tokens')} input tokens, {verdict.get('method')})"
    needed = verdict.get("input_tokens", 0) + verdict.get("margin_tokens", 0) + verdict.get("output_tokens", 0)
    relation = "<=" if verdict.get("fits") else ">"
    return (
        f"{verdict.get('input_tokens')} input ({verdict.get('method')}) + {verdict.get('margin_tokens')} margin"
        f" + {verdict.get('output_tokens')} output = {needed} {relation} context window {verdict.get('context_window')}"
    )


def _routing(
    policy: Policy, data: Mapping[str, Any], plan: Mapping[str, Any], facts: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """What the substituting layers (L4 intent, L3 budget tiers) proposed and why, and
    which model the first target the gateway would try serves: a substitute, a
    fallback (failover), or the resolved model (engine/routing.substitution)."""
    routing = Routing.from_plan(plan.get("routing"))
    model = plan.get("model")
    resolved = routing.substituted_from or model
    tried = [row for row in candidates if row["status"] == "kept"]
    first = min(tried, key=lambda row: row["order"]) if tried else None
    served = first["canonical_model"] if first is not None else None
    taken = substitution(resolved, model, served, routing) if served is not None else None
    layers = [{**record, "why": _layer_why(data, record, facts)} for record in routing.audit_view()]
    replaced: list[dict[str, Any]] = []
    if routing.substituted_from is not None:  # the resolved model's candidates the substitute's chain does not share (tier)
        routed = {(row["target"], row["canonical_model"]) for row in candidates}
        for candidate in _query(policy, CANDIDATES, {"model": routing.substituted_from}) or []:
            if (target_id(candidate), candidate.get("canonical_model")) in routed:
                continue
            replaced.append(
                {"target": target_id(candidate), "canonical_model": candidate.get("canonical_model"), "reason": f"the {routing.layer} layer's substitute"}
            )
    return {
        "resolved": resolved,
        "model": model,
        "served_first": served,
        "substitution": {"from": taken[0], "to": served, "layer": taken[1]} if taken else None,
        "layers": layers,
        "replaced_targets": replaced,
        "not_proposing": _silent_layers(facts, layers),
    }


def _layer_why(data: Mapping[str, Any], record: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    if record.get("layer") == "intent":
        why = _intent_why(data, record, facts)
    elif record.get("layer") == "budget_tier":
        percent = ((facts.get("budgets") or {}).get(record.get("budget")) or {}).get("percent")
        why = f"budget {record.get('budget')} at {percent}% (facts.budgets) reached tier {record.get('tier')} (from {record.get('threshold_percent')}%)"
    else:
        why = f"layer {record.get('layer')}"
    if record.get("from") == record.get("to"):
        return f"{why}; it names the model the request already had"
    if record.get("applied"):
        return f"{why}; {record.get('to')} replaced {record.get('from')}"
    return f"{why}; {record.get('to')} refused ({', '.join(record.get('reasons') or [])}), {record.get('from')} kept"


def _intent_why(data: Mapping[str, Any], record: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    routers = ((data.get("intent") or {}).get("routers")) or []
    router = next((r for r in routers if r.get("name") == record.get("router")), {})
    tier, by = record.get("tier"), record.get("by")
    if by == "pin":
        return f"router {record.get('router')}: the session's pinned tier {tier} (facts.session)"
    if by == "classifier":
        confidence = (facts.get("classifier") or {}).get("confidence")
        return f"router {record.get('router')}: the classifier's tier {tier} at confidence {confidence} (facts.classifier)"
    if by == "rule":
        rules = router.get("rules") or []
        index = record.get("rule")
        when = rules[index].get("when") if isinstance(index, int) and index < len(rules) else None
        return f"router {record.get('router')}: rule {index} (when {when}) chose tier {tier} from facts.features"
    return f"router {record.get('router')}: no rule matched facts.features, its default tier {tier}"


def _silent_layers(facts: Mapping[str, Any], layers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The substituting layers that proposed nothing, and why (decision.rego _routed)."""
    proposed = {record.get("layer") for record in layers}
    silent = []
    if not any(key in facts for key in ("features", "session", "classifier")):
        silent.append("intent: no features, session or classifier fact, so no router was asked")
    elif "intent" not in proposed:
        silent.append("intent: no router covers this team and model (or the request was refused before routing)")
    if "budgets" not in facts:
        silent.append("budget_tier: no budgets fact, so no tier was asked")
    elif "budget_tier" not in proposed:
        silent.append("budget_tier: no tier reached for this team and model (or the request was refused before routing)")
    return silent
