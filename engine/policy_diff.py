"""What a bundle change does to real decisions: recorded decision inputs (the decision
log) replayed against two bundles, each difference sorted into the kind a reviewer asks
about — above all, what the new bundle allows that the old one refused (a widening).

Each input is decided by each bundle as the gateway decides it (``ActiveBundle.decide``),
so each bundle's compiled index is its own, whatever revision recorded the input. The
outcome compared is what the plan enforces: allow or refuse (and why), the model and
the chain of targets with their regions, each counter's block limit, the PII action per
entity, and the tool-call rules the response guard will apply (allow-lists, deny rules,
declared-only); tools the request offers are judged in the decision itself. Context fit
(L5) is judged after the plan, against token counts the input does not hold: not compared.

Pure: decides in-process, reads no file, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.activation import ActiveBundle
from portcullis.engine.decision_log import DECISION_PATH
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.rego import PolicyError


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
    Kind("region_added", "a region added", True),
    Kind("region_removed", "a region removed", False),
    Kind("limit_looser", "limit looser", True),
    Kind("limit_tighter", "limit tighter", False),
    Kind("pii_weaker", "PII action weaker", True),
    Kind("pii_stricter", "PII action stricter", False),
    Kind("tools_looser", "tool calls: a rule no longer applies", True),
    Kind("tools_tighter", "tool calls: a rule now applies", False),
)
KIND = {kind.name: kind for kind in KINDS}
FAIL_ON = {"widen": frozenset(kind.name for kind in KINDS if kind.widens), "any": frozenset(KIND)}
# Strictest first, as policies/portcullis/pii.rego merges them; no action at all is the weakest.
_PII_STRICTNESS = ("block", "redact", "tokenize", "pseudonymize", "mask")
MASKED = "(masked)"


@dataclass(frozen=True)
class Outcome:
    """What one bundle's plan for one input enforces."""

    allow: bool
    reason: str
    model: str | None
    targets: tuple[str, ...]  # provider/model@region, in the plan's order
    regions: frozenset[str]
    limits: Mapping[str, int]  # "scope metric/period" -> block limit (micro-USD for cost)
    pii: Mapping[str, str]  # entity -> action; "on_error" -> fail_closed | fail_open
    tools: frozenset[str]  # the tool-call rules that apply: "allow [patterns]", "deny <rule>", "declared only"

    def summary(self) -> dict[str, Any]:
        if not self.allow:
            return {"allow": False, "reason": self.reason}
        return {"allow": True, "model": self.model, "targets": list(self.targets)}


def outcome(plan: DecisionPlan) -> Outcome:
    regions: set[str] = set()
    for target in plan.targets:
        regions.update(target.regions or (target.region,))
    pii: dict[str, str] = {}
    if plan.pii is not None:
        pii = dict(plan.pii.actions)
        pii["on_error"] = plan.pii.on_error
    return Outcome(
        allow=plan.allow,
        reason=str(plan.reasons[0].get("code")) if plan.reasons else "",
        model=plan.model,
        targets=tuple(f"{t.provider}/{t.model}@{t.region}" for t in plan.targets),
        regions=frozenset(regions),
        limits={f"{c.scope} {c.metric}/{c.period}": c.block for c in plan.limits.counters if c.block is not None},
        pii=pii,
        tools=_tool_rules(plan),
    )


def _tool_rules(plan: DecisionPlan) -> frozenset[str]:
    integrity = plan.integrity
    if integrity is None:
        return frozenset()
    rules = {f"allow only {' or '.join(patterns)}" for patterns in integrity.tools_allow}
    rules |= {f"deny rule {rule}" for rule in integrity.tools_deny}
    return frozenset(rules | ({"declared tools only"} if integrity.declared_only else set()))


def changes(old: Outcome | str, new: Outcome | str) -> list[tuple[str, str]]:
    """Each difference as (kind, what changed); a str is why a bundle could not decide
    (the gateway refuses then, so the new bundle failing is ``undecidable`` and the old
    one failing is a refusal like any other). A flip of allow says it all: the rest of a refused plan
    (no targets, no limits) is not a change of its own."""
    if isinstance(new, str):
        return [] if isinstance(old, str) else [("undecidable", f"{_said(old)} → {new}")]
    if isinstance(old, str):  # the gateway refused: allowing it now is a widening like any other
        return [("deny_to_allow", f"{old} → allowed")] if new.allow else [("refusal_reason", f"{old} → {new.reason}")]
    if old.allow != new.allow:
        return [("deny_to_allow", f"{old.reason} → allowed") if new.allow else ("allow_to_deny", f"allowed → {new.reason}")]
    if not new.allow:
        return [("refusal_reason", f"{old.reason} → {new.reason}")] if old.reason != new.reason else []
    found = []
    if old.model != new.model:
        found.append(("model", f"{old.model} → {new.model}"))
    elif old.targets != new.targets:
        found.append(("targets", f"{', '.join(old.targets)} → {', '.join(new.targets)}"))
    found += [("region_added", region) for region in sorted(new.regions - old.regions)]
    found += [("region_removed", region) for region in sorted(old.regions - new.regions)]
    found += _limit_changes(old.limits, new.limits)
    found += _pii_changes(old.pii, new.pii)
    found += [("tools_looser", rule) for rule in sorted(old.tools - new.tools)]
    found += [("tools_tighter", rule) for rule in sorted(new.tools - old.tools)]
    return found


def _limit_changes(old: Mapping[str, int], new: Mapping[str, int]) -> list[tuple[str, str]]:
    found = []
    for counter in sorted(old.keys() | new.keys()):
        before, after = old.get(counter), new.get(counter)
        if before == after:
            continue
        if after is None:
            found.append(("limit_looser", f"{counter}: {before} → no limit"))
        elif before is None:
            found.append(("limit_tighter", f"{counter}: no limit → {after}"))
        else:
            found.append(("limit_tighter" if after < before else "limit_looser", f"{counter}: {before} → {after}"))
    return found


def _pii_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[tuple[str, str]]:
    found = []
    for entity in sorted(old.keys() | new.keys()):
        before, after = old.get(entity), new.get(entity)
        if before == after:
            continue
        weaker = after != "fail_closed" if entity == "on_error" else _pii_rank(after) > _pii_rank(before)
        found.append(("pii_weaker" if weaker else "pii_stricter", f"{entity}: {before or 'none'} → {after or 'none'}"))
    return found


def _pii_rank(action: str | None) -> int:
    return _PII_STRICTNESS.index(action) if action in _PII_STRICTNESS else len(_PII_STRICTNESS)


@dataclass
class Group:
    """One kind of change across the replay: how often, whom it touches, a few examples."""

    count: int = 0
    principals: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Diff:
    old: Mapping[str, str]  # revision, digest
    new: Mapping[str, str]
    examples: int = 3
    replayed: int = 0
    changed: int = 0
    skipped: int = 0  # not a decision of this entry point, or no input (or not one the gateway builds)
    masked: int = 0  # inputs the decision log had masked: replayed without the erased values
    # Recorded by the old bundle itself (same digest): whether replaying reproduced what it
    # decided then. A masked input, or a fact the log lacks, shows up here as diverged.
    reproduced: int = 0
    diverged: int = 0
    recorded_revisions: Counter[str] = field(default_factory=Counter)
    groups: dict[str, Group] = field(default_factory=dict)

    def caught(self, fail_on: str | None) -> list[str]:
        """The kinds of change found that ``--fail-on`` refuses, in report order."""
        if fail_on is None:
            return []
        return [kind.name for kind in KINDS if kind.name in FAIL_ON[fail_on] and kind.name in self.groups]

    def as_json(self) -> dict[str, Any]:
        return {
            "old": dict(self.old),
            "new": dict(self.new),
            "inputs": {
                "replayed": self.replayed,
                "changed": self.changed,
                "unchanged": self.replayed - self.changed,
                "skipped": self.skipped,
                "masked": self.masked,
                "reproduced": self.reproduced,
                "diverged": self.diverged,
                "recorded_revisions": dict(self.recorded_revisions),
            },
            "changes": {
                kind.name: {
                    "title": kind.title,
                    "widens": kind.widens,
                    "count": group.count,
                    "principals": dict(group.principals.most_common()),
                    "examples": group.examples,
                }
                for kind in KINDS
                if (group := self.groups.get(kind.name)) is not None
            },
        }


class Replay:
    """Decides recorded inputs under two bundles and gathers what differs."""

    def __init__(self, old: ActiveBundle, new: ActiveBundle, examples: int = 3) -> None:
        self._bundles = (old, new)
        self.diff = Diff({"revision": old.revision, "digest": old.digest}, {"revision": new.revision, "digest": new.digest}, examples)

    def add_all(self, events: Iterable[Mapping[str, Any]]) -> Diff:
        for event in events:
            self.add(event)
        return self.diff

    def add(self, event: Mapping[str, Any]) -> None:
        document = event.get("input")
        if event.get("path", DECISION_PATH) != DECISION_PATH or not _decidable(document):
            self.diff.skipped += 1
            return
        diff = self.diff
        diff.replayed += 1
        revision = ((event.get("bundles") or {}).get("portcullis") or {}).get("revision")
        diff.recorded_revisions[revision if isinstance(revision, str) else "(none)"] += 1
        if event.get("erased"):
            diff.masked += 1
        old, new = (_decided(bundle, document) for bundle in self._bundles)
        self._check_fidelity(event, document, old)
        found = changes(old, new)
        if not found:
            return
        diff.changed += 1
        who = principal_of(document)
        for kind, detail in found:
            group = diff.groups.setdefault(kind, Group())
            group.count += 1
            group.principals[who] += 1
            if len(group.examples) < diff.examples:
                group.examples.append(
                    {
                        "decision_id": event.get("decision_id"),
                        "principal": who,
                        "requested_model": (document.get("request") or {}).get("model"),
                        "change": detail,
                        "old": old.summary() if isinstance(old, Outcome) else {"error": old},
                        "new": new.summary() if isinstance(new, Outcome) else {"error": new},
                    }
                )


    def _check_fidelity(self, event: Mapping[str, Any], document: Mapping[str, Any], replayed: Outcome | str) -> None:
        """Against the decision as recorded, when the old bundle is the one that made it
        and the log kept its result whole."""
        result = event.get("result")
        erased = event.get("erased") or []
        if not isinstance(result, dict) or not result or event.get("bundle_digest") != self.diff.old["digest"]:
            return
        if any(isinstance(pointer, str) and pointer.startswith("/result") for pointer in erased):
            return
        principal = document.get("principal") or {}
        try:
            recorded = outcome(DecisionPlan.from_policy(result, {"user": principal.get("user"), "key_id": principal.get("key_id")}))
        except (KeyError, TypeError, ValueError, AttributeError):  # not a plan this engine reads
            return
        if changes(recorded, replayed):
            self.diff.diverged += 1
        else:
            self.diff.reproduced += 1


def _decidable(document: Any) -> bool:
    """An input document the gateway could have built: objects where it puts objects."""
    return isinstance(document, dict) and all(isinstance(document.get(part, {}), dict) for part in ("principal", "request", "facts"))


def _decided(bundle: ActiveBundle, document: Mapping[str, Any]) -> Outcome | str:
    """The bundle's outcome, or why it could not decide (the gateway refuses then)."""
    try:
        return outcome(bundle.decide(document))
    except PolicyError as error:
        return f"policy error: {error}"


def principal_of(document: Mapping[str, Any]) -> str:
    principal = document.get("principal")
    if not isinstance(principal, dict) or not isinstance(principal.get("team"), str):
        return MASKED
    user = principal.get("user")
    return f"{principal['team']}/{user}" if isinstance(user, str) else principal["team"]


def _said(result: Outcome) -> str:
    return "allowed" if result.allow else result.reason
