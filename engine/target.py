"""A target: one authorised place a request may be dispatched to, as the decision plan
names it (provider, the provider's model ID, region and what the route can do).

``region`` is where the request is processed; ``regions`` every region it may be
processed in, which is more than one for a cross-region inference profile (the
policy admitted the whole set) and just ``(region,)`` otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One authorised place a request may be dispatched to."""

    canonical_model: str
    provider: str
    model: str  # the provider's own model ID
    region: str
    priority: int
    context_window: int
    max_output_tokens: int
    capabilities: tuple[str, ...]
    internal: bool = False  # inside the organisation's boundary: may receive what filters cannot inspect
    regions: tuple[str, ...] = ()  # filled in from region when the plan names no set

    @classmethod
    def from_plan(cls, entry: Mapping[str, Any]) -> Target:
        return cls(
            canonical_model=entry["canonical_model"],
            provider=entry["provider"],
            model=entry["model"],
            region=entry["region"],
            priority=entry["priority"],
            context_window=entry["context_window"],
            max_output_tokens=entry["max_output_tokens"],
            capabilities=tuple(entry.get("capabilities", ())),
            internal=bool(entry.get("internal", False)),
            regions=tuple(entry.get("regions") or (entry["region"],)),
        )

    def __post_init__(self) -> None:
        if not self.regions:
            object.__setattr__(self, "regions", (self.region,))

    def describe(self) -> dict[str, Any]:
        described = {"provider": self.provider, "model": self.model, "region": self.region, "canonical_model": self.canonical_model}
        if len(self.regions) > 1:  # a cross-region profile: where it may have been processed
            described["regions"] = list(self.regions)
        return described
