"""The bundle's intent routers (``data.portcullis.intent``), as the gateway reads them:
which router covers a request, the keyword sets it matches texts against, how long a
session keeps its tier, and the checks a bundle must pass before it serves traffic.

The policy (``policies/portcullis/intent.rego``) decides the tier. Python reads the
routers only to know when there is anything to gather: a request no router covers gets
no features, no session lookup and no classifier call, so bundles without routers cost
nothing. ``router_for`` picks the router the same way the policy does (the first whose
teams and models cover the request)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.intent_keywords import NO_KEYWORDS, KeywordError, KeywordMatcher

DEFAULT_PIN_TTL_SECONDS = 3600
ANY_TEAM = "*"


@dataclass(frozen=True)
class IntentRouters:
    routers: tuple[Mapping[str, Any], ...] = ()
    keywords: KeywordMatcher = field(default=NO_KEYWORDS)
    pin_ttl_seconds: int = DEFAULT_PIN_TTL_SECONDS

    @classmethod
    def from_data(cls, intent: Mapping[str, Any] | None) -> IntentRouters:
        intent = intent or {}
        routers = tuple(intent.get("routers") or ())
        if not routers:
            return NO_ROUTERS
        return cls(routers, KeywordMatcher(intent.get("keyword_sets") or {}), int(intent.get("pin_ttl_seconds", DEFAULT_PIN_TTL_SECONDS)))

    def router_for(self, team: str, model: str | None) -> Mapping[str, Any] | None:
        """The router covering ``team`` asking for the canonical ``model``, if any."""
        if model is None:
            return None
        for router in self.routers:
            if (team in router["teams"] or ANY_TEAM in router["teams"]) and model in router["models"]:
                return router
        return None


NO_ROUTERS = IntentRouters()


def canonical(catalog: Mapping[str, Any], requested: str) -> str | None:
    """The canonical model a requested name resolves to, as access.resolve does."""
    if requested in catalog.get("models", {}):
        return requested
    return catalog.get("aliases", {}).get(requested)


def intent_problems(intent: Mapping[str, Any] | None, catalog: Mapping[str, Any], teams: Sequence[str]) -> list[str]:
    """What makes a bundle's routers unusable, each named: refused at activation, since a
    tier naming a model the catalog does not serve, or a rule naming a keyword set that
    does not exist, would route nothing and say nothing."""
    intent = intent or {}
    models = catalog.get("models", {})
    aliases = catalog.get("aliases", {})
    sets = intent.get("keyword_sets") or {}
    problems: list[str] = []
    try:
        KeywordMatcher(sets)
    except KeywordError as error:
        problems.append(f"intent keyword_sets: {error}")
    names = [router["name"] for router in intent.get("routers") or ()]
    problems += [f"intent router {name!r} is defined twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for router in intent.get("routers") or ():
        where = f"intent router {router['name']!r}"
        problems += [f"{where}: team {team!r} is not defined in tenants" for team in router["teams"] if team != ANY_TEAM and team not in teams]
        for model in router["models"]:
            if model not in models:
                hint = f" (an alias of {aliases[model]!r}: name the canonical model)" if model in aliases else ""
                problems.append(f"{where}: requested model {model!r} is not a canonical model of the catalog{hint}")
        tiers = router["tiers"]
        problems += [f"{where}: tier {tier!r} names model {model!r}, which the catalog does not serve" for tier, model in tiers.items() if model not in models]
        if router["default_tier"] not in tiers:
            problems.append(f"{where}: default_tier {router['default_tier']!r} is not one of its tiers ({', '.join(sorted(tiers))})")
        for index, rule in enumerate(router.get("rules") or ()):
            if rule["tier"] not in tiers:
                problems.append(f"{where}: rule {index} chooses tier {rule['tier']!r}, which is not one of its tiers")
            named = [*rule["when"].get("keywords_any", ()), *rule["when"].get("keywords_none", ())]
            problems += [f"{where}: rule {index} names keyword set {name!r}, which keyword_sets does not define" for name in named if name not in sets]
        classifier = router.get("classifier")
        if classifier is not None and classifier["model"] not in models:
            problems.append(f"{where}: classifier model {classifier['model']!r} is not served by the catalog")
        elif classifier is not None and not any(target.get("internal") for target in models[classifier["model"]]["targets"]):
            problems.append(f"{where}: classifier model {classifier['model']!r} has no internal target (it reads raw text)")
    return problems
