"""Layer C's judgement: scanner results (from the bundle's rules) against the team's
policy. A text is an injection when its score reaches its surface's threshold; the
strictest action of the surfaces it was found on decides."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from portcullis.engine.errors import ErrorKind, GatewayError

HEADER = "x-portcullis-injection-warning"


@dataclass(frozen=True)
class ScanResult:
    rules: tuple[str, ...]
    score: int

    @classmethod
    def from_policy(cls, entry: Mapping[str, object]) -> ScanResult:
        return cls(tuple(entry["rules"]), int(entry["score"]))  # type: ignore[arg-type, call-overload]


@dataclass(frozen=True)
class InjectionReview:
    findings: Mapping[str, tuple[str, ...]]  # surface -> rule ids, over the threshold only
    action: str | None  # block | warn | None

    def refusal(self) -> GatewayError:
        message = f"the request looks like a prompt injection ({self.describe()}), which this team's policy blocks"
        return GatewayError(ErrorKind.INVALID_REQUEST, message, code="prompt_injection")

    def describe(self) -> str:
        return "; ".join(f"{surface}: {', '.join(rules)}" for surface, rules in sorted(self.findings.items()))


def review(results: Iterable[tuple[str, ScanResult]], surfaces: Mapping[str, str], thresholds: Mapping[str, int]) -> InjectionReview:
    """``surfaces``: the action per scanned surface; ``thresholds``: the score from which
    a text on that surface is an injection."""
    found: dict[str, set[str]] = {}
    for surface, result in results:
        if surface in surfaces and result.score >= thresholds.get(surface, 3):
            found.setdefault(surface, set()).update(result.rules)
    actions = {surfaces[surface] for surface in found}
    action = "block" if "block" in actions else "warn" if actions else None
    return InjectionReview({surface: tuple(sorted(rules)) for surface, rules in found.items()}, action)
