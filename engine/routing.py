"""What the routing layers that may substitute a model (L4 intent tiers, L3 budget
tiers) did for one request, as the decision plan records it: every proposal, whether
re-authorisation let it through, and the model the request resolved to before them.

The served model differs from the resolved one either because a layer substituted it
or because failover (L6) reached a fallback model; both are told to the client
(``x-portcullis-model-fallback``) and kept in the audit record with the layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FAILOVER = "failover"  # the layer named when a fallback model, not a substitution, served


@dataclass(frozen=True)
class Routing:
    layers: tuple[Mapping[str, Any], ...] = ()
    substituted_from: str | None = None  # the canonical model the request resolved to, when a layer replaced it
    layer: str | None = None  # the last layer whose substitution was taken

    @classmethod
    def from_plan(cls, document: Mapping[str, Any] | None) -> Routing:
        if not document:
            return NO_ROUTING
        return cls(tuple(document["layers"]), document.get("substituted_from"), document.get("layer"))

    def layer_record(self, layer: str) -> Mapping[str, Any] | None:
        """What ``layer`` proposed for this request, taken or not."""
        return next((record for record in self.layers if record["layer"] == layer), None)

    def audit_view(self) -> list[dict[str, Any]]:
        """Each proposal as the audit log keeps it: names, tiers and reasons, no facts."""
        return [{key: record[key] for key in _AUDITED if key in record} for record in self.layers]


_AUDITED = ("layer", "from", "to", "applied", "tier", "reasons", "budget", "pinned", "router", "by", "rule")
NO_ROUTING = Routing()


def substitution(resolved: str | None, model: str | None, served: str, routing: Routing) -> tuple[str, str] | None:
    """(the model substituted from, the layer that did it) when ``served`` is not the
    model the request resolved to (``resolved``), None when it is. ``model`` is the
    plan's: serving it means a routing layer's substitute served; serving another means
    failover reached a fallback model."""
    if resolved is None or served == resolved:
        return None
    return resolved, routing.layer if routing.layer is not None and served == model else FAILOVER
