"""What a bundle change does to real decisions: recorded decision inputs (the decision
log) replayed against two bundles, each difference sorted by ``engine/decision_changes``
into the kind a reviewer asks about, with counts, examples and the principals affected.

Each input is decided by each bundle as the gateway decides it (``ActiveBundle.decide``),
so each bundle's compiled index is its own, whatever revision recorded the input. Context
fit (L5) is judged after the plan, against token counts the input does not hold: not
compared. A tool call's arguments are not in the input either: the tool-call rules that
apply are compared, with their definitions, not verdicts on calls.

A gate must not pass what it could not compare: an input the log masked, or a decision
the old bundle no longer reproduces, is counted, and ``caught`` refuses it under
``--fail-on`` unless masked inputs are accepted explicitly.

Pure: decides in-process, reads no file, no clock.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.activation import ActiveBundle
from portcullis.engine.decision_changes import KIND, KINDS, Definitions, Outcome, changes, outcome
from portcullis.engine.decision_log import DECISION_PATH
from portcullis.engine.errors import printable
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.rego import PolicyError

FAIL_ON = {"widen": frozenset(kind.name for kind in KINDS if kind.widens), "any": frozenset(KIND)}
UNCOMPARED = "uncompared"  # what `caught` names when inputs could not be replayed as they were
MASKED = "(masked)"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")  # schemas/bundle-data.schema.json#/$defs/identifier


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

    def caught(self, fail_on: str | None, allow_masked: bool = False) -> list[str]:
        """What ``--fail-on`` refuses: the kinds of change found, in report order, and
        ``uncompared`` when some inputs could not be replayed as they happened."""
        if fail_on is None:
            return []
        found = [kind.name for kind in KINDS if kind.name in FAIL_ON[fail_on] and kind.name in self.groups]
        return [*found, UNCOMPARED] if (self.masked or self.diverged) and not allow_masked else found

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
        self._definitions = tuple(Definitions.of((bundle.bundle.data.get("portcullis") or {}).get("integrity")) for bundle in self._bundles)
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
        bundles = event.get("bundles")
        recorded = bundles.get("portcullis") if isinstance(bundles, dict) else None
        revision = recorded.get("revision") if isinstance(recorded, dict) else None
        diff.recorded_revisions[printable(revision) if isinstance(revision, str) else "(none)"] += 1
        erased = [pointer for pointer in event.get("erased") or [] if isinstance(pointer, str)] if isinstance(event.get("erased"), list) else []
        if any(pointer.startswith("/input") for pointer in erased):
            diff.masked += 1
        old, new = (_decided(bundle, document, definitions) for bundle, definitions in zip(self._bundles, self._definitions, strict=True))
        if not any(pointer.startswith("/result") for pointer in erased):
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
                        "decision_id": printable(event.get("decision_id")),
                        "principal": who,
                        "requested_model": printable((document.get("request") or {}).get("model")),
                        "change": detail,
                        "old": old.summary() if isinstance(old, Outcome) else {"error": old},
                        "new": new.summary() if isinstance(new, Outcome) else {"error": new},
                    }
                )

    def _check_fidelity(self, event: Mapping[str, Any], document: Mapping[str, Any], replayed: Outcome | str) -> None:
        """Against the decision as recorded, when the old bundle is the one that made it
        and the log kept its result whole."""
        result = event.get("result")
        if not isinstance(result, dict) or not result or event.get("bundle_digest") != self.diff.old["digest"]:
            return
        principal = document.get("principal") or {}
        try:
            plan = DecisionPlan.from_policy(result, {"user": principal.get("user"), "key_id": principal.get("key_id")})
            recorded = outcome(plan, self._definitions[0])
        except (KeyError, TypeError, ValueError, AttributeError):  # not a plan this engine reads
            return
        if changes(recorded, replayed):
            self.diff.diverged += 1
        else:
            self.diff.reproduced += 1


def _decidable(document: Any) -> bool:
    """An input document the gateway could have built: objects where it puts objects, and
    the principal's ids strings (or no user / key)."""
    if not isinstance(document, dict) or not all(isinstance(document.get(part, {}), dict) for part in ("principal", "request", "facts")):
        return False
    principal = document.get("principal") or {}
    return all(isinstance(principal.get(name), str | None) for name in ("team", "user", "key_id"))


def _decided(bundle: ActiveBundle, document: Mapping[str, Any], definitions: Definitions) -> Outcome | str:
    """The bundle's outcome, or why it could not decide (the gateway refuses then)."""
    try:
        return outcome(bundle.decide(document), definitions)
    except PolicyError as error:
        return f"policy error: {error}"


def principal_of(document: Mapping[str, Any]) -> str:
    """``team/user`` as reviewers know them (ids as tenants/data.yaml spells them; anything
    else, which a log could hold, is not echoed into a terminal or a CI log)."""
    principal = document.get("principal")
    if not isinstance(principal, dict) or not isinstance(principal.get("team"), str):
        return MASKED
    parts = [principal["team"]] + ([principal["user"]] if isinstance(principal.get("user"), str) else [])
    return "/".join(part if _ID.fullmatch(part) else "<unprintable>" for part in parts)
