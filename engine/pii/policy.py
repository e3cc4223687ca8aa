"""A team's merged PII policy, as the decision plan carries it, and the judgement of
what was found against it: what must be refused, and what the policy cannot cover."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pii.recognizers import Finding
from portcullis.engine.pii.redaction import REVERSIBLE
from portcullis.engine.target import Target

# Surfaces a filter reads but cannot change: personal data found there is unsupported.
SIGNED = "signed"  # reasoning the provider signed
OTHER = "other"  # fields the gateway does not transform: unknown members, keys, enums
_SURFACE_NAMES = {SIGNED: "signed reasoning (thinking)", OTHER: "fields the filter cannot change"}
# Instructions and chat turns are one egress field, ``text``, whoever wrote them.
_FIELD_OF = {"system": "text", "user": "text", "assistant": "text"}


def field_of(surface: str) -> str:
    """The egress field (``scope.supported_egress_fields``) a surface belongs to."""
    return _FIELD_OF.get(surface, surface)


@dataclass(frozen=True)
class PiiPolicy:
    policies: tuple[str, ...]
    actions: Mapping[str, str]
    detectors: tuple[str, ...]
    min_score: float
    fields: frozenset[str]
    unsupported: str  # block | internal
    on_error: str  # fail_closed | fail_open
    restore_tokens: bool
    classifier: Target | None = None  # an internal target the classifier detector may call
    classifier_max_output_tokens: int = 512

    @classmethod
    def from_plan(cls, entry: Mapping[str, Any] | None) -> PiiPolicy | None:
        if entry is None:
            return None
        return cls(
            policies=tuple(entry["policies"]),
            actions=dict(entry["actions"]),
            detectors=tuple(entry["detectors"]),
            min_score=float(entry["min_score"]),
            fields=frozenset(entry["fields"]),
            unsupported=entry["unsupported"],
            on_error=entry["on_error"],
            restore_tokens=bool(entry["restore_tokens"]),
            classifier=Target.from_plan(entry["classifier"]["target"]) if entry.get("classifier") else None,
            classifier_max_output_tokens=(entry.get("classifier") or {}).get("max_output_tokens", 512),
        )

    @property
    def entities(self) -> frozenset[str]:
        return frozenset(self.actions)

    @property
    def reversible_entities(self) -> frozenset[str]:
        """The entity types whose placeholders an answer may be restored from."""
        return frozenset(entity for entity, action in self.actions.items() if action in REVERSIBLE)

    @property
    def reversible(self) -> bool:
        return bool(self.reversible_entities)


@dataclass(frozen=True)
class Review:
    """What a request holds, judged against the policy."""

    found: Mapping[str, int]  # entity -> occurrences
    actions: Mapping[str, int]  # action -> occurrences
    blocked: Mapping[str, int]  # entity -> occurrences the policy blocks
    unsupported: tuple[str, ...]  # content kinds or surfaces the policy cannot cover

    def refusal(self, policy: PiiPolicy) -> GatewayError | None:
        """The client-facing refusal, naming entity types and content kinds, never values."""
        if self.blocked:
            named = ", ".join(f"{entity} ({count})" for entity, count in sorted(self.blocked.items()))
            message = f"the request contains personal data this team's policy does not allow to leave: {named}"
            return GatewayError(ErrorKind.INVALID_REQUEST, message, code="pii_blocked")
        if self.unsupported and policy.unsupported == "block":
            named = ", ".join(self.unsupported)
            return GatewayError(
                ErrorKind.INVALID_REQUEST,
                f"the request carries content this team's PII policy cannot inspect or transform: {named}",
                code="pii_unsupported_content",
            )
        return None


def review(findings: Iterable[tuple[str, Finding]], opaque: Iterable[str], policy: PiiPolicy) -> Review:
    """``findings`` are (surface, finding) pairs; ``opaque`` the content kinds that could
    not be inspected. Personal data on a surface the policy does not support, and every
    opaque kind, is unsupported sensitive content: never silently let through."""
    found: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    blocked: Counter[str] = Counter()
    unsupported = set(opaque)
    for surface, finding in findings:
        action = policy.actions.get(finding.entity)
        if action is None:
            continue
        found[finding.entity] += 1
        actions[action] += 1
        if action == "block":
            blocked[finding.entity] += 1
        elif field_of(surface) not in policy.fields:
            unsupported.add(_SURFACE_NAMES.get(surface, surface))
    return Review(dict(found), dict(actions), dict(blocked), tuple(sorted(unsupported)))


def detector_problems(pii: Mapping[str, Any] | None, catalog: Mapping[str, Any], available: Iterable[str]) -> list[str]:
    """Policies that could not be enforced as written: a detector this gateway does not
    run, or a classifier with no internal target to run on. Their bundle is refused."""
    enabled = set(available)
    problems = []
    for name, policy in sorted(((pii or {}).get("policies") or {}).items()):
        for detector in policy.get("detectors", ()):
            if detector not in ("patterns", "classifier") and detector not in enabled:
                problems.append(f"pii policy {name!r} asks for the {detector} detector, which this gateway has not enabled")
            if detector == "classifier" and not _classifier_targets(pii, catalog):
                problems.append(f"pii policy {name!r} asks for the classifier, but pii.classifier names no model with an internal target")
    return problems


def _classifier_targets(pii: Mapping[str, Any] | None, catalog: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    model = ((pii or {}).get("classifier") or {}).get("model")
    model = (catalog.get("aliases") or {}).get(model, model)
    return [t for t in (catalog.get("models") or {}).get(model, {}).get("targets", ()) if t.get("internal")]
