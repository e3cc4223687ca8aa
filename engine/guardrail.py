"""The Bedrock guardrail a decision plan requires (the team's and the model's
requirements, merged by the policy in guardrails.rego). The gateway applies it to
Bedrock targets in place of anything the client asked for: it is policy, not a
client option."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Trace = Literal["enabled", "disabled", "enabled_full"]


@dataclass(frozen=True)
class Guardrail:
    identifier: str  # the guardrail's ID or ARN (Bedrock's guardrailIdentifier)
    version: str  # "1", "2", … or "DRAFT" (Bedrock's guardrailVersion)
    trace: Trace = "disabled"

    @classmethod
    def from_plan(cls, entry: Mapping[str, Any] | None) -> Guardrail | None:
        if entry is None:
            return None
        return cls(identifier=entry["identifier"], version=entry["version"], trace=entry["trace"])

    def describe(self) -> dict[str, str]:
        return {"identifier": self.identifier, "version": self.version, "trace": self.trace}
