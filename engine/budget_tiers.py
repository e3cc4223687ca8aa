"""L3 budget tiers, the gateway's part: which budget counter each team's tiers read,
and whether the bundle's tiers can be enforced at all.

The policy (``budget_tiers.rego``) decides from ``input.facts.budgets``, so the
counter must be read *before* the decision. The plan's ``limits.counters`` would name
it, but only after; so once per bundle this module works out, for every team, the
named budget's counter scope (``{user}`` / ``{key}`` left for the request's ids, as
the governance index does), period and limit. A request then reads one counter
instance's high-water mark and turns it into a percent of the rule's own limit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.engine.governance import COST, DAY, MONTH, fill_scope, period_key
from portcullis.engine.pricing import micro_usd

EVERY_TEAM = "*"
_PERIODS = {"CalendarMonth": MONTH, "CalendarDay": DAY}


@dataclass(frozen=True)
class BudgetRead:
    """One team's tiered budget: the rule's name, its counter and its limit."""

    budget: str  # the governance rule's name, as input.facts.budgets names it
    scope: str  # as governance.rego's _scope_of writes it, with {user} / {key} to fill
    keyless_scope: str  # the scope of a key with no user (differs for `per: user`)
    period: str
    limit_micro_usd: int

    def key(self, principal: Mapping[str, Any], now: dt.datetime) -> str:
        """The counter instance this principal's requests charge now."""
        scope = self.scope if principal.get("user") is not None else self.keyless_scope
        return f"{fill_scope(scope, principal)}|{COST}|{period_key(self.period, now)}"

    def percent(self, peak: int) -> int:
        """The highest utilisation reached, in whole percent of the current limit."""
        return peak * 100 // self.limit_micro_usd


@dataclass(frozen=True)
class BudgetReads:
    by_team: Mapping[str, BudgetRead]

    def for_team(self, team: str) -> BudgetRead | None:
        return self.by_team.get(team)


NO_READS = BudgetReads({})


def budget_reads(data: Mapping[str, Any] | None) -> BudgetReads:
    """Every team's tiered budget (a team's own entry, else ``"*"``); a bundle that
    fails ``budget_tier_problems`` never gets this far."""
    configs = ((data or {}).get("budget_tiers") or {}).get("teams") or {}
    if not configs:
        return NO_READS
    rules = ((data or {}).get("governance") or {}).get("rules") or {}
    teams = ((data or {}).get("tenants") or {}).get("teams") or {}
    reads = {}
    for team in teams:
        config = configs.get(team) or configs.get(EVERY_TEAM)
        rule = rules.get(config["budget"]) if config else None
        if rule and rule.get("budget"):
            reads[team] = BudgetRead(
                budget=config["budget"],
                scope=_scope(rule["subject"], team, has_user=True),
                keyless_scope=_scope(rule["subject"], team, has_user=False),
                period=_PERIODS[rule["budget"]["period"]],
                limit_micro_usd=micro_usd(str(rule["budget"]["limit_usd"])),
            )
    return BudgetReads(reads)


def _scope(subject: Mapping[str, Any], team: str, has_user: bool) -> str:
    """governance.rego's _scope_of for a rule that covers a whole team (or every team)."""
    per = subject.get("per")
    if per == "key" or (per == "user" and not has_user):
        return "key:{key}"
    if per == "user":
        return f"user:{team}/{{user}}"
    if "team" in subject:
        return f"team:{subject['team']}"
    return "org"


def budget_tier_problems(data: Mapping[str, Any]) -> list[str]:
    """Why the bundle's budget tiers could not be enforced as written, each naming the
    entry: an unknown team, a budget that is not a budget rule or does not cover the
    whole team, a substitution naming a model the catalog does not serve, thresholds
    out of order."""
    configs = (data.get("budget_tiers") or {}).get("teams") or {}
    rules = (data.get("governance") or {}).get("rules") or {}
    teams = (data.get("tenants") or {}).get("teams") or {}
    models = (data.get("catalog") or {}).get("models") or {}
    aliases = (data.get("catalog") or {}).get("aliases") or {}
    problems: list[str] = []
    for team, config in configs.items():
        where = f"budget_tiers.teams[{team!r}]"
        if team != EVERY_TEAM and team not in teams:
            problems.append(f"{where}: team {team!r} is not defined in tenants.teams")
        problems += _budget_problems(where, team, config["budget"], rules)
        thresholds = [tier["threshold_percent"] for tier in config["tiers"]]
        if thresholds != sorted(set(thresholds)):
            problems.append(f"{where}: tier thresholds must be strictly ascending (got {thresholds})")
        names = [tier["name"] for tier in config["tiers"]]
        if len(set(names)) != len(names):
            problems.append(f"{where}: tier names must be distinct (got {names})")
        for tier in config["tiers"]:
            for model, substitute in tier["substitutions"].items():
                for name in (model, substitute):
                    if name not in models:
                        hint = f" (an alias of {aliases[name]!r}: name the canonical model)" if name in aliases else ""
                        problems.append(f"{where} tier {tier['name']!r}: model {name!r} is not in the catalog{hint}")
                if model == substitute:
                    problems.append(f"{where} tier {tier['name']!r}: {model!r} substitutes for itself")
    return problems


def _budget_problems(where: str, team: str, name: str, rules: Mapping[str, Any]) -> list[str]:
    rule = rules.get(name)
    if rule is None:
        return [f"{where}: budget {name!r} is not a governance rule"]
    if not rule.get("budget"):
        return [f"{where}: governance rule {name!r} has no budget"]
    subject = rule.get("subject") or {}
    if "user" in subject or "key" in subject:
        return [f"{where}: budget {name!r} covers one user or key, not the whole team"]
    if subject.get("team", team) != team:
        whom = "every team" if team == EVERY_TEAM else f"team {team!r}"
        return [f"{where}: budget {name!r} applies to team {subject['team']!r}, not to {whom}"]
    if micro_usd(str(rule["budget"]["limit_usd"])) == 0:
        return [f"{where}: budget {name!r} has a limit of 0, of which no percent can be reached"]
    return []
