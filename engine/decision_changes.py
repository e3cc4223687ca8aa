"""How two decisions of the same request differ, in the kinds a security reviewer asks
about; above all, what the second grants that the first did not (a widening).

An ``Outcome`` is what a plan enforces: allow or refuse (and why), the model and the chain
of targets (providers, regions, which are internal), each counter's limit, the PII
policy (actions per entity and how it detects and restores), the integrity policy (the
output guard, the injection scanner, spotlighting, the tool-call rules with their
definitions) and the Bedrock guardrail. Any other difference in the plan is
``plan_other``: ``--fail-on any`` means any. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.plan import DecisionPlan


@dataclass(frozen=True)
class Kind:
    name: str
    title: str
    widens: bool  # grants what the old bundle did not: what `--fail-on widen` catches


KINDS = (
    Kind("deny_to_allow", "refused → allowed", True),
    Kind("allow_to_deny", "allowed → refused", False),
    Kind("refusal_reason", "refused for another reason", False),
    Kind("undecidable", "the new bundle cannot decide", False),
    Kind("model", "model changed", False),
    Kind("targets", "targets changed", False),
    Kind("provider_added", "a provider, or an internal target, may now receive the request", True),
    Kind("region_added", "a region added", True),
    Kind("region_removed", "a region removed", False),
    Kind("limit_looser", "limit looser", True),
    Kind("limit_tighter", "limit tighter", False),
    Kind("pii_weaker", "PII protection weaker", True),
    Kind("pii_stricter", "PII protection stricter", False),
    Kind("tools_looser", "tool calls: a rule no longer applies, or changed", True),
    Kind("tools_tighter", "tool calls: a rule now applies", False),
    Kind("integrity_weaker", "prompt integrity or guardrail weaker", True),
    Kind("integrity_stricter", "prompt integrity or guardrail stricter", False),
    Kind("plan_other", "the plan changed otherwise", False),
)
KIND = {kind.name: kind for kind in KINDS}
# Strictest first; absent is weaker than any (as policies/portcullis/*.rego merge them).
PII_ACTIONS = ("block", "redact", "tokenize", "pseudonymize", "mask")
OUTPUT_ACTIONS = ("withhold", "redact", "flag")
SCAN_ACTIONS = ("block", "warn")
UNSUPPORTED = ("block", "internal")
ON_ERROR = ("fail_closed", "fail_open")

Change = tuple[str, str]


@dataclass(frozen=True)
class Definitions:
    """The rules a plan names or implies but does not hold (data.portcullis.integrity's
    tool_rules and injection_rules), by what each does: one bundle's, computed once, so
    a rule whose pattern or weight changed under the same id is a change."""

    tool_rules: Mapping[str, str] = field(default_factory=dict)  # id -> fingerprint
    injection_rules: frozenset[str] = frozenset()  # "id (fingerprint)"

    @classmethod
    def of(cls, integrity: Mapping[str, Any] | None) -> Definitions:
        integrity = integrity or {}
        tool_rules = [rule for rule in integrity.get("tool_rules") or () if isinstance(rule, Mapping)]
        injection_rules = [rule for rule in integrity.get("injection_rules") or () if isinstance(rule, Mapping)]
        return cls(
            tool_rules={rule.get("id"): _fingerprint(rule) for rule in tool_rules},
            injection_rules=frozenset(f"{rule.get('id')} ({_fingerprint(rule)})" for rule in injection_rules),
        )


NO_DEFINITIONS = Definitions()


@dataclass(frozen=True)
class Outcome:
    """What one bundle's plan for one request enforces."""

    allow: bool
    reason: str
    model: str | None = None
    targets: tuple[str, ...] = ()  # provider/model@region, in the plan's order
    providers: frozenset[str] = frozenset()  # and each target marked internal, as "<target> (internal)"
    regions: frozenset[str] = frozenset()
    limits: Mapping[str, tuple[int, bool]] = field(default_factory=dict)  # "scope metric/period" -> (block limit, hard)
    pii: Mapping[str, Any] | None = None
    integrity: Mapping[str, Any] | None = None
    tools: frozenset[str] = frozenset()  # the tool-call rules that apply, deny rules with their definition
    guardrail: str | None = None
    document: str = ""  # the plan as the policy returned it, canonical: the catch-all

    def summary(self) -> dict[str, Any]:
        if not self.allow:
            return {"allow": False, "reason": self.reason}
        return {"allow": True, "model": self.model, "targets": list(self.targets)}


def outcome(plan: DecisionPlan, definitions: Definitions = NO_DEFINITIONS) -> Outcome:
    """``definitions``: those of the bundle that made the plan."""
    pii = None
    if plan.pii is not None:
        policy = plan.pii
        pii = {
            "actions": dict(policy.actions),
            "on_error": policy.on_error,
            "unsupported": policy.unsupported,
            "restore_tokens": policy.restore_tokens,
            "min_score": policy.min_score,
            "detectors": frozenset(policy.detectors),
            "fields": policy.fields,
        }
    integrity = None
    tools: set[str] = set()
    if plan.integrity is not None:
        policy = plan.integrity
        integrity = {
            "output": dict(policy.output_actions),
            "scan": dict(policy.scan_surfaces),
            "thresholds": dict(policy.thresholds),
            "spotlight": policy.spotlight,
            "allowed_hosts": frozenset(" or ".join(hosts) for hosts in policy.allowed_hosts),
            "canaries": frozenset(policy.prompt.canaries) if policy.prompt is not None else frozenset(),
            "prompt": _fingerprint({"version": policy.prompt.version, "text": policy.prompt.text}) if policy.prompt is not None else None,
            "injection_rules": definitions.injection_rules if policy.scan_surfaces else frozenset(),  # they matter only where it scans
        }
        tools = {f"allow only {' or '.join(patterns)}" for patterns in policy.tools_allow}
        tools |= {f"deny rule {rule} ({definitions.tool_rules.get(rule, '?')})" for rule in policy.tools_deny}
        tools |= {"declared tools only"} if policy.declared_only else set()
    targets = tuple(f"{t.provider}/{t.model}@{t.region}" for t in plan.targets)
    return Outcome(
        allow=plan.allow,
        reason=str(plan.reasons[0].get("code")) if plan.reasons else "",
        model=plan.model,
        targets=targets,
        providers=frozenset(t.provider for t in plan.targets) | {f"{shown} (internal)" for shown, t in zip(targets, plan.targets, strict=True) if t.internal},
        regions=frozenset(region for t in plan.targets for region in t.regions or (t.region,)),
        limits={f"{c.scope} {c.metric}/{c.period}": (c.block, c.hard) for c in plan.limits.counters if c.block is not None},
        pii=pii,
        integrity=integrity,
        tools=frozenset(tools),
        guardrail=f"{plan.guardrail.identifier} v{plan.guardrail.version}" if plan.guardrail is not None else None,
        document=json.dumps(plan.source, sort_keys=True, default=str) if plan.source is not None else "",
    )


def changes(old: Outcome | str, new: Outcome | str) -> list[Change]:
    """Each difference as (kind, what changed); a str is why a bundle could not decide
    (the gateway refuses then, so the new bundle failing is ``undecidable`` and the old
    one failing is a refusal like any other). A flip of allow says it all: the rest of a
    refused plan (no targets, no limits) is not a change of its own."""
    if isinstance(new, str):
        return [] if isinstance(old, str) else [("undecidable", f"{_said(old)} → {new}")]
    if isinstance(old, str):
        return [("deny_to_allow", f"{old} → allowed")] if new.allow else [("refusal_reason", f"{old} → {new.reason}")]
    if old.allow != new.allow:
        return [("deny_to_allow", f"{old.reason} → allowed") if new.allow else ("allow_to_deny", f"allowed → {new.reason}")]
    if not new.allow:
        return [("refusal_reason", f"{old.reason} → {new.reason}")] if old.reason != new.reason else []
    found: list[Change] = []
    if old.model != new.model:
        found.append(("model", f"{old.model} → {new.model}"))
    elif old.targets != new.targets:
        found.append(("targets", f"{', '.join(old.targets)} → {', '.join(new.targets)}"))
    found += [("provider_added", provider) for provider in sorted(new.providers - old.providers)]
    found += [("region_added", region) for region in sorted(new.regions - old.regions)]
    found += [("region_removed", region) for region in sorted(old.regions - new.regions)]
    found += _limit_changes(old.limits, new.limits)
    found += _pii_changes(old.pii, new.pii)
    found += [("tools_looser", rule) for rule in sorted(old.tools - new.tools)]
    found += [("tools_tighter", rule) for rule in sorted(new.tools - old.tools)]
    found += _integrity_changes(old, new)
    if not found and old.document != new.document:
        found.append(("plan_other", ", ".join(_differing_keys(old.document, new.document))))
    return found


def _limit_changes(old: Mapping[str, tuple[int, bool]], new: Mapping[str, tuple[int, bool]]) -> list[Change]:
    found = []
    for counter in sorted(old.keys() | new.keys()):
        before, after = old.get(counter), new.get(counter)
        if before == after:
            continue
        if after is None:
            found.append(("limit_looser", f"{counter}: {before[0]} → no limit"))  # type: ignore[index]
            continue
        if before is None:
            found.append(("limit_tighter", f"{counter}: no limit → {after[0]}"))
            continue
        if before[0] != after[0]:
            found.append(("limit_tighter" if after[0] < before[0] else "limit_looser", f"{counter}: {before[0]} → {after[0]}"))
        if before[1] != after[1]:  # a hard cap refuses the request that would cross it; a soft one lets it finish
            found.append(("limit_looser" if before[1] else "limit_tighter", f"{counter}: {'hard' if before[1] else 'soft'} → {'hard' if after[1] else 'soft'}"))
    return found


def _pii_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Change]:
    if old is None and new is None:
        return []
    if old is None or new is None:
        return [("pii_stricter", "a PII policy now applies") if old is None else ("pii_weaker", "no PII policy applies")]
    found = _ranked("pii", "", PII_ACTIONS, old["actions"], new["actions"])
    found += _ranked("pii", "", ON_ERROR, {"on_error": old["on_error"]}, {"on_error": new["on_error"]})
    found += _ranked("pii", "", UNSUPPORTED, {"unsupported content": old["unsupported"]}, {"unsupported content": new["unsupported"]})
    if old["restore_tokens"] != new["restore_tokens"]:  # restoring hands the principal the original values back
        found.append(("pii_weaker" if new["restore_tokens"] else "pii_stricter", f"restore_tokens: {old['restore_tokens']} → {new['restore_tokens']}"))
    found += _numbers("pii", "min_score", old["min_score"], new["min_score"])
    found += _members("pii", "detector", old["detectors"], new["detectors"])
    # the fields the filter can transform: personal data found outside them is unsupported
    # content (blocked, or sent to internal targets only), so one more lets more leave
    found += _members("pii", "transformable field", old["fields"], new["fields"], fewer_is_weaker=False)
    return found


def _integrity_changes(old: Outcome, new: Outcome) -> list[Change]:
    found: list[Change] = []
    if old.guardrail != new.guardrail:  # another guardrail may filter less: a reviewer's call, so it counts as weaker
        kind = "integrity_stricter" if old.guardrail is None else "integrity_weaker"
        found.append((kind, f"guardrail: {old.guardrail or 'none'} → {new.guardrail or 'none'}"))
    before, after = old.integrity, new.integrity
    if before is None and after is None:
        return found
    if before is None or after is None:
        return [*found, ("integrity_stricter", "an integrity policy now applies") if before is None else ("integrity_weaker", "no integrity policy applies")]
    found += _ranked("integrity", "output ", OUTPUT_ACTIONS, before["output"], after["output"])
    found += _ranked("integrity", "scan ", SCAN_ACTIONS, before["scan"], after["scan"])
    for surface in sorted(before["thresholds"].keys() & after["thresholds"].keys()):
        found += _numbers("integrity", f"injection threshold {surface}", before["thresholds"][surface], after["thresholds"][surface])
    found += _members("integrity", "spotlight", before["spotlight"], after["spotlight"])
    found += _members("integrity", "canary", before["canaries"], after["canaries"])
    found += _members("integrity", "injection rule", before["injection_rules"], after["injection_rules"])
    # a URL is let through only when every policy judging URLs allows its host: one list
    # fewer lets more through
    found += _members("integrity", "allowed-host list", before["allowed_hosts"], after["allowed_hosts"])
    if before["prompt"] != after["prompt"]:
        found.append(("integrity_weaker", "no policy prompt") if after["prompt"] is None else ("plan_other", "the policy prompt's text"))
    return found


def _ranked(area: str, label: str, order: Sequence[str], old: Mapping[str, str], new: Mapping[str, str]) -> list[Change]:
    """Per key, an action in ``order`` (strictest first; absent is weakest)."""
    found = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if before != after:
            weaker = _rank(order, after) > _rank(order, before)
            found.append((f"{area}_{'weaker' if weaker else 'stricter'}", f"{label}{key}: {before or 'none'} → {after or 'none'}"))
    return found


def _numbers(area: str, label: str, old: float, new: float) -> list[Change]:
    """A score from which something is caught: raised, less is caught."""
    return [] if old == new else [(f"{area}_{'weaker' if new > old else 'stricter'}", f"{label}: {old} → {new}")]


def _members(area: str, label: str, old: Collection[str], new: Collection[str], fewer_is_weaker: bool = True) -> list[Change]:
    """What is inspected or applied: one fewer is weaker (or, ``fewer_is_weaker=False``, stricter)."""
    fewer, more = ("weaker", "stricter") if fewer_is_weaker else ("stricter", "weaker")
    removed = [(f"{area}_{fewer}", f"no {label} {item}") for item in sorted(set(old) - set(new))]
    return removed + [(f"{area}_{more}", f"{label} {item}") for item in sorted(set(new) - set(old))]


def _rank(order: Sequence[str], action: str | None) -> int:
    return order.index(action) if action in order else len(order)


def _fingerprint(rule: Mapping[str, Any]) -> str:
    """What a rule does, not how it is described."""
    meaning = {key: value for key, value in rule.items() if key not in ("message", "description")}
    return hashlib.sha256(json.dumps(meaning, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _differing_keys(old: str, new: str) -> list[str]:
    before, after = json.loads(old or "{}"), json.loads(new or "{}")
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key)) or ["(order)"]


def _said(result: Outcome) -> str:
    return "allowed" if result.allow else result.reason
