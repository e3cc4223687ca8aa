"""Consistency checks a bundle's catalog must pass before it may serve traffic.

JSON Schema checks each document's shape; these check what one document says about
another: aliases and fallbacks point at models that exist, an alias never shadows a
canonical ID, every target names a configured provider, and every route has a price
in effect (a route without a price would settle at zero and silently disable
budget control, seed §4.8). A target that may route to several regions (a Bedrock
cross-region inference profile) must say which, or no region lock could hold for it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Mapping
from typing import Any

from portcullis.engine.pricing import PriceTable

# Bedrock model IDs that name a cross-region inference profile: a geography prefix on a
# model ID, or an inference-profile ARN (system-defined or an application's own).
_PROFILE_ID = re.compile(r"(us|eu|apac|global|us-gov|jp|au|ca)\.[^.]")
_PROFILE_ARN = re.compile(r"arn:aws[a-z-]*:bedrock:[^:]*:[^:]*:(application-)?inference-profile/")


def routes_across_regions(model: str) -> bool:
    """Whether a provider model ID names an inference profile, which may be processed in
    any of several regions rather than in its target's one."""
    return bool(_PROFILE_ID.match(model) or _PROFILE_ARN.match(model))


def catalog_problems(catalog: Mapping[str, Any], providers: Collection[str], prices: PriceTable, today: dt.date) -> list[str]:
    """Every inconsistency found, each naming the field at fault; empty when the catalog is sound."""
    models: Mapping[str, Any] = catalog.get("models", {})
    problems: list[str] = []
    for alias, model in catalog.get("aliases", {}).items():
        if alias in models:
            problems.append(f"catalog.aliases.{alias}: shadows the canonical model of the same name")
        if model not in models:
            problems.append(f"catalog.aliases.{alias}: points at unknown model {model!r}")
    for name, spec in models.items():
        for fallback in spec.get("fallbacks", []):
            if fallback == name or fallback not in models:
                problems.append(f"catalog.models.{name}.fallbacks: {fallback!r} is not another known model")
        for i, target in enumerate(spec.get("targets", [])):
            where = f"catalog.models.{name}.targets[{i}]"
            if target["provider"] not in providers:
                problems.append(f"{where}.provider: {target['provider']!r} is not a configured provider")
            problems += _region_problems(where, target)
            if prices.price_for(target["provider"], target["model"], target.get("region"), today) is None:
                problems.append(
                    f"{where}: no price in effect for {target['provider']}/{target['model']}"
                    f" in region {target.get('region')!r}; a route without a price is refused"
                )
    return problems


def _region_problems(where: str, target: Mapping[str, Any]) -> list[str]:
    regions = target.get("regions")
    if regions is None:
        if routes_across_regions(target["model"]):
            return [
                f"{where}: model {target['model']!r} is a cross-region inference profile, so its region is ambiguous:"
                " declare the regions it may route to (regions: [...])"
            ]
        return []
    if target["region"] not in regions:
        return [f"{where}.regions: does not include the target's region {target['region']!r}"]
    return []
