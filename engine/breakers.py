"""Circuit breakers (routing layer L6), as the bundle configures them: how many
consecutive failures open a target's breaker and how long it stays open before one
probe may test it again. A target is one place a request is sent (provider, the
provider's model ID, region), named ``provider/model@region`` in the facts the policy
reads and in the store where every replica sees the same state.

A bundle without ``data.portcullis.breakers`` has no breakers: nothing is counted and
no target is ever skipped for its health (the product's bundle turns them on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.target import Target

DEFAULT_CONSECUTIVE_FAILURES = 5
DEFAULT_OPEN_SECONDS = 30.0


@dataclass(frozen=True)
class BreakerRule:
    consecutive_failures: int = DEFAULT_CONSECUTIVE_FAILURES  # failures in a row that open the breaker
    open_seconds: float = DEFAULT_OPEN_SECONDS  # how long it stays open before one probe may go

    @classmethod
    def from_data(cls, entry: Mapping[str, Any] | None, base: BreakerRule | None = None) -> BreakerRule:
        base = base or cls()
        entry = entry or {}
        return cls(
            int(entry.get("consecutive_failures", base.consecutive_failures)),
            float(entry.get("open_seconds", base.open_seconds)),
        )

    @property
    def open_ms(self) -> int:
        return max(1, int(self.open_seconds * 1000))


@dataclass(frozen=True)
class BreakerSettings:
    default: BreakerRule = BreakerRule()
    providers: Mapping[str, BreakerRule] = field(default_factory=dict)  # a provider's own rule, over the default

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> BreakerSettings | None:
        """From ``data.portcullis.breakers``; None when the bundle has none (breakers off)."""
        if data is None:
            return None
        default = BreakerRule.from_data(data.get("default"))
        overrides = {name: BreakerRule.from_data(entry, default) for name, entry in (data.get("providers") or {}).items()}
        return cls(default, overrides)

    def rule_for(self, provider: str) -> BreakerRule:
        return self.providers.get(provider, self.default)


def target_id(target: Target) -> str:
    """``provider/model@region``: the name a breaker has in facts, store and audit."""
    return f"{target.provider}/{target.model}@{target.region}"
