"""Endpoint picking (routing layer L7) as routing policy: read from the bundle's data
(``data.portcullis.endpoints``) once per activation, with defaults when it is absent.

These numbers only choose among the endpoints of a target the plan already
authorised — which pod of a self-hosted pool serves a request — never which targets
may serve it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EndpointPolicy:
    system_blocks: int = 2  # how many system texts, from the first, join a conversation's affinity key
    virtual_nodes: int = 128  # ring points per endpoint
    max_waiting: float = 16  # a pod with more requests queued than this is skipped
    max_kv_cache_percent: float = 90  # and one whose KV cache is fuller than this

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> EndpointPolicy:
        """From ``data.portcullis.endpoints`` (schema-checked before this is called)."""
        data = data or {}
        defaults = cls()
        return cls(
            system_blocks=int(data.get("system_blocks", defaults.system_blocks)),
            virtual_nodes=int(data.get("virtual_nodes", defaults.virtual_nodes)),
            max_waiting=float(data.get("max_waiting", defaults.max_waiting)),
            max_kv_cache_percent=float(data.get("max_kv_cache_percent", defaults.max_kv_cache_percent)),
        )


DEFAULT_POLICY = EndpointPolicy()
