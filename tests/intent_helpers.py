"""Intent-tier test bundles: the standard test catalog and tenants with the reference
router's rules and the quickstart's keyword sets, on the test catalog's models."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.bundles import CATALOG, POLICY_SOURCES, ROOT, target, write_bundle

QUICKSTART_INTENT = yaml.safe_load((POLICY_SOURCES / "intent" / "data.yaml").read_text())
REFERENCE_ROUTER = yaml.safe_load((ROOT / "examples" / "intent" / "router.yaml").read_text())
FRONTIER = "claude-opus-4-8"
FRONTIER_UPSTREAM = "claude-opus-4-8-20261101"


def intent_catalog() -> dict[str, Any]:
    """The test catalog plus a frontier model on the US Anthropic fake."""
    catalog = copy.deepcopy(CATALOG)
    catalog["models"][FRONTIER] = {"targets": [target("anthropic-us", FRONTIER_UPSTREAM, "us-east-1")]}
    catalog["prices"].append(
        {"provider": "anthropic-us", "model": FRONTIER_UPSTREAM, "effective_from": "2026-01-01", "usd_per_mtok": {"input": "5", "output": "25"}}
    )
    return catalog


def router(**overrides: Any) -> dict[str, Any]:
    """The reference router over the test catalog: haiku, sonnet, opus."""
    tiers = {"light": "claude-haiku-4-5", "standard": "claude-sonnet-4-5", "frontier": FRONTIER}
    return {**copy.deepcopy(REFERENCE_ROUTER), "tiers": tiers, **overrides}


def intent_data(routers: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    return {"keyword_sets": QUICKSTART_INTENT["keyword_sets"], "pin_ttl_seconds": 3600, "routers": [router()] if routers is None else routers, **overrides}


def write_intent_bundle(directory: Path, intent: dict[str, Any] | None = None, tenants: dict[str, Any] | None = None, revision: str = "intent-1") -> Path:
    intent = intent if intent is not None else intent_data()
    return write_bundle(directory, tenants=tenants, catalog=intent_catalog(), revision=revision, sections={"intent": intent})
