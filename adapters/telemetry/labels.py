"""Which values may become a metric label: only those the configuration and the active
bundle name (its teams, canonical models and regions; the configured providers), and
the gateway's own codes. Anything else a request carries — a model name the client
sent before the policy resolved it, a key id, a user id, a tool name — is never a
label: it collapses into ``_rejected``.

A metrics system that labels what clients send grows a series per bogus name; a team
the bundle drops stops being a new label at the next bundle (its old series stay until
the process restarts, bounded by what bundles ever named)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REJECTED = "_rejected"
NONE = ""  # a label that does not apply (no team before authentication, no provider before dispatch)
MAX_NAMES = 256  # per kind of name (reason codes, PII entity types, rule ids): more is a fault, not traffic
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


class LabelBounds:
    """Label values for one bundle; ``for_bundle`` gives the bounds of the bundle a request
    was decided under (one object per bundle digest, rebuilt when a reload activates another)."""

    def __init__(self, providers: Iterable[str]) -> None:
        self._providers = frozenset(providers)
        self._digest: str | None = None
        self._teams: frozenset[str] = frozenset()
        self._models: frozenset[str] = frozenset()
        self._regions: frozenset[str] = frozenset()
        self._names: dict[str, set[str]] = {}

    def for_bundle(self, bundle: Any) -> LabelBounds:
        if bundle is not None and bundle.digest != self._digest:
            data = bundle.bundle.data.get("portcullis") or {}
            teams = (data.get("tenants") or {}).get("teams") or {}
            models = bundle.catalog.get("models") or {}
            self._teams = frozenset(teams) if isinstance(teams, dict) else frozenset()
            self._models = frozenset(models)
            self._regions = frozenset(
                target.get("region")
                for model in models.values()
                if isinstance(model, dict)
                for target in model.get("targets") or ()
                if isinstance(target, dict) and isinstance(target.get("region"), str)
            )
            self._digest = bundle.digest
        return self

    def team(self, value: str | None) -> str:
        return NONE if value is None else value if value in self._teams else REJECTED

    def model(self, value: str | None) -> str:
        return NONE if value is None else value if value in self._models else REJECTED

    def provider(self, value: str | None) -> str:
        return NONE if value is None else value if value in self._providers else REJECTED

    def region(self, value: str | None) -> str:
        return NONE if value is None else value if value in self._regions else REJECTED

    def named(self, kind: str, value: str | None) -> str:
        """A name the gateway's code or the bundle defines (a reason code, a PII entity
        type, a tool rule): kept if it is shaped like one and fewer than ``MAX_NAMES`` of
        its kind were seen; a value the policy echoes from a client could not pass both."""
        if value is None:
            return NONE
        seen = self._names.setdefault(kind, set())
        if value in seen:
            return value
        if not _NAME.fullmatch(value) or len(seen) >= MAX_NAMES:
            return REJECTED
        seen.add(value)
        return value

    @staticmethod
    def one_of(value: str | None, allowed: frozenset[str]) -> str:
        """A value from a fixed set the code defines (a surface, an action, a layer)."""
        return NONE if value is None else value if value in allowed else REJECTED
