"""``portcullis policy eval``'s report as text: the decision first, then its checks,
every candidate target, the routing layers, the merged limits, PII and integrity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_MARK = {True: "ok", False: "NO", None: "--"}


def render(report: Mapping[str, Any]) -> str:
    lines: list[str] = []
    explanation = report["explanation"]
    _header(lines, report)
    _decision(lines, report["decision"], explanation["decided_by"])
    _checks(lines, explanation["checks"])
    _targets(lines, explanation["targets"], report["decision"].get("model"))
    _routing(lines, explanation["routing"])
    _limits(lines, explanation["limits"])
    _pii(lines, explanation.get("pii"))
    _integrity(lines, explanation.get("integrity"))
    return "\n".join(lines)


def _header(lines: list[str], report: Mapping[str, Any]) -> None:
    document = report["input"]
    principal, request = document.get("principal") or {}, document.get("request") or {}
    bundle = report["bundle"]
    lines.append(f"bundle     {bundle['revision'] or '(no revision)'} ({bundle['digest'][:12]})")
    lines.append(f"principal  {report['explanation']['principal']} (key {principal.get('key_id')})")
    lines.append(
        f"request    {request.get('protocol')} model={request.get('model')} stream={request.get('stream')}"
        f" max_tokens={request.get('max_tokens')} requires={request.get('requires')} tools={request.get('tools')}"
    )
    facts = document.get("facts") or {}
    lines.append(f"facts      {', '.join(facts) if facts else '(none)'}")
    lines.append("")


def _decision(lines: list[str], decision: Mapping[str, Any], decided_by: Mapping[str, Any]) -> None:
    verdict = "ALLOW" if decision["allow"] else "DENY"
    lines.append(f"{verdict}  {decision['code']}: {decision['message']}")
    if decision.get("model") and decision["model"] != decision["requested_model"]:
        lines.append(f"  model        {decision['requested_model']} -> {decision['model']}")
    refusal = decision.get("refusal")
    if refusal is not None:
        lines.append(f"  client sees  {refusal['status']} {refusal['code']}: {refusal['message']}")
    lines.append(f"  decided by   {decided_by['rule']}")
    lines.append("")


def _checks(lines: list[str], checks: Sequence[Mapping[str, Any]]) -> None:
    lines.append("Checks (decision.rego, in its order)")
    for check in checks:
        lines.append(f"  {_MARK[check['passed']]}  {check['check']:<10} {check['detail']}  [{check['rule']}]")
    lines.append("")


def _targets(lines: list[str], rows: Sequence[Mapping[str, Any]], model: str | None) -> None:
    if not rows:
        lines.append("Targets: none (the request was refused before any model's candidates)")
        lines.append("")
        return
    lines.append(f"Targets: the candidates of {model}, in the bundle's order (own targets by priority, then fallbacks')")
    for row in rows:
        status = f"{row['status']} (tried {row['order']})" if row["status"] == "kept" else row["status"]
        reasons = f": {', '.join(row['reasons'])}" if row["reasons"] else ""
        lines.append(f"  {row['position']}. {row['target']}  [{row['via']} {row['canonical_model']}, priority {row['priority']}]  {status}{reasons}")
        checks = row["checks"]
        passed = [name for name, check in checks.items() if check["passed"]]
        lines.append(f"       passed: {', '.join(passed) or '(none)'}")
        for name, check in checks.items():
            if not check["passed"] or name in ("region", "capability", "context_fit") or (name == "breaker" and "closed" not in check["detail"]):
                lines.append(f"       {_MARK[check['passed']]} {name}: {check['detail']}")
    lines.append("")


def _routing(lines: list[str], routing: Mapping[str, Any]) -> None:
    lines.append("Routing")
    served = routing["served_first"]
    lines.append(f"  resolved {routing['resolved']}; the plan's model {routing['model']}; the first target tried serves {served or 'nothing (refused)'}")
    taken = routing.get("substitution")
    if served is None:
        pass
    elif taken is None:
        lines.append("  no substitution: the model the request resolved to serves")
    elif taken["layer"] == "failover":
        lines.append(f"  failover: a fallback of {taken['from']} serves ({taken['to']}): its own targets were all rejected")
    else:
        lines.append(f"  substituted by layer {taken['layer']}: {taken['from']} -> {taken['to']}")
    for record in routing["layers"]:
        state = "taken" if record.get("applied") else "refused"
        lines.append(f"  layer {record['layer']} ({state}): {record['why']}")
    if routing["replaced_targets"]:
        replaced = ", ".join(row["target"] for row in routing["replaced_targets"])
        lines.append(f"  set aside for {routing['replaced_targets'][0]['reason']}: {replaced}")
    for note in routing["not_proposing"]:
        lines.append(f"  no proposal from {note}")
    lines.append("")


def _limits(lines: list[str], limits: Mapping[str, Any]) -> None:
    if not limits["counters"] and not limits["unlimited"]:
        lines.append("Limits: no governance rule applies")
        lines.append("")
        return
    lines.append("Limits (every applying governance rule, merged per counter: the lowest Block limit governs)")
    for counter in limits["counters"]:
        warn = f" warn {counter['warn']}" if counter.get("warn") is not None else ""
        nature = "hard" if counter.get("hard") else "soft"
        block = counter["block"] if counter.get("block") is not None else "none"
        lines.append(f"  {counter['scope']} {counter['metric']}/{counter['period']}: block {block}{warn} ({nature})")
        for entry in counter["rules"]:
            lines.append(f"    {entry['part']:<8} {entry['rule']}: {entry['limit']} ({entry['policy']})")
    for label, effective in limits["effective"].items():
        lines.append(f"  effective {label} {effective['limit']}: {', '.join(effective['counters'])} ({', '.join(effective['rules'])})")
    if limits["unlimited"]:
        lines.append(f"  unlimited (listed, adds and removes no limit): {', '.join(limits['unlimited'])}")
    lines.append("")


def _merged(proposals: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}: {value}" for name, value in proposals.items())


def _pii(lines: list[str], pii: Mapping[str, Any] | None) -> None:
    if pii is None:
        lines.append("PII: no policy applies to this team")
        lines.append("")
        return
    absent = f" (not applying: {', '.join(pii['not_applying'])})" if pii["not_applying"] else ""
    lines.append(f"PII policies {', '.join(pii['policies'])}{absent}: per entity the strictest action")
    for entity, action in pii["actions"].items():
        lines.append(f"  {entity:<16} {action['action']:<13} from {', '.join(action['from'])}  ({_merged(action['proposed'])})")
    detectors = "; ".join(f"{name} ({', '.join(sources)})" for name, sources in pii["detectors"].items())
    lines.append(f"  detectors {detectors}")
    for setting in ("min_score", "on_error", "unsupported"):
        lines.append(f"  {setting} {pii[setting]['value']} from {', '.join(pii[setting]['from']) or '(defaults)'}")
    lines.append(f"  fields {', '.join(pii['fields'])}; restore tokens: {pii['restore_tokens']}")
    lines.append("")


def _integrity(lines: list[str], integrity: Mapping[str, Any] | None) -> None:
    if integrity is None:
        lines.append("Integrity: no policy applies to this team")
        return
    absent = f" (not applying: {', '.join(integrity['not_applying'])})" if integrity["not_applying"] else ""
    lines.append(f"Integrity policies {', '.join(integrity['policies'])}{absent}")
    if integrity["prompt"]:
        lines.append(f"  policy prompt {integrity['prompt']}")
    for surface, merged in integrity["injection"].items():
        threshold = merged["threshold"]
        lines.append(
            f"  injection {surface}: {merged['action']} from {', '.join(merged['from'])} ({_merged(merged['proposed'])}),"
            f" threshold {threshold['value']} from {', '.join(threshold['from'])}"
        )
    for finding, merged in integrity["output"].items():
        lines.append(f"  output {finding}: {merged['action']} from {', '.join(merged['from'])} ({_merged(merged['proposed'])})")
    tools = integrity["tools"]
    for name, allow in tools["allow"].items():
        lines.append(f"  tools allowed by {name}: {allow}")
    for rule, sources in tools["deny"].items():
        lines.append(f"  tool rule {rule} from {', '.join(sources)}")
    if tools["declared_only"]["value"]:
        lines.append(f"  declared tools only, from {', '.join(tools['declared_only']['from'])}")
    for source, names in integrity["spotlight"].items():
        lines.append(f"  spotlight {source} from {', '.join(names)}")
