"""The calendar counters a whole team, or the whole organisation, charges: what the budget
utilisation gauge reads, worked out once per bundle from its governance rules.

``governance.rego`` gives a rule whose subject names only a team the counter
``team:<team>``, and a rule with an empty subject ``org``; rules landing on one counter
merge most restrictively (the lowest Block limit, the lowest Warn limit below it), and
a charge's ceiling is the Block limit, else the Warn one (``Charge.as_record``). This
module does the same for those two scopes, so no decision has to be evaluated to know
them; ``tests/test_unit_budget_gauge.py`` checks it against the plans' own counters.

Left out, on purpose:

- per-user, per-key and named-user or named-key scopes: their counters are keyed by a
  user or key id, and a team's highest user would mean listing every user's counter in
  the period (the ledger has no index by team; in Redis, a keyspace scan), which the
  bundle does not bound;
- rate windows (rpm, tpm): a store slides a window only when a reservation arrives, so
  an idle window still holds its last minute; the refusals counter (layer ``rate``)
  shows a window that bites;
- a ceiling of 0, of which no fraction can be taken.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.engine.governance import COST, DAY, MONTH, TOKENS, period_key
from portcullis.engine.pricing import micro_usd

_PERIODS = {"CalendarMonth": MONTH, "CalendarDay": DAY}
ORG = "org"


@dataclass(frozen=True)
class TeamCounter:
    team: str | None  # None: the organisation's, charged by every team
    scope: str  # team:<team> | org
    metric: str  # tokens | cost (micro-USD)
    period: str  # day | month
    ceiling: int
    rules: tuple[str, ...]  # the governance rules merged on it, sorted

    def key(self, now: dt.datetime) -> str:
        """The counter instance charged now, as ``governance.charges`` names it."""
        return f"{self.scope}|{self.metric}|{period_key(self.period, now)}"


def team_counters(data: Mapping[str, Any] | None) -> tuple[TeamCounter, ...]:
    """Every team-wide and organisation-wide calendar counter the bundle's rules define,
    for teams in ``tenants.teams``: at most 3 per team and 3 for the organisation (tokens
    a day, cost a day, cost a month)."""
    rules = ((data or {}).get("governance") or {}).get("rules") or {}
    teams = ((data or {}).get("tenants") or {}).get("teams") or {}
    groups: dict[tuple[str, str, str], list[tuple[str, str, int]]] = {}  # (scope, metric, period) -> (rule, policy, limit)
    owners: dict[str, str | None] = {}
    for name, rule in rules.items():
        subject = rule.get("subject") or {}
        if rule.get("unlimited") or set(subject) - {"team"}:  # an exemption adds no limit; the rest is per principal
            continue
        team = subject.get("team")
        if team is not None and team not in teams:
            continue
        scope = f"team:{team}" if team is not None else ORG
        owners[scope] = team
        policy = rule.get("failure_policy", "Block")
        for metric, period, limit in _calendar_limits(rule):
            groups.setdefault((scope, metric, period), []).append((name, policy, limit))
    found = []
    for (scope, metric, period), entries in sorted(groups.items()):
        ceiling = _ceiling(entries)
        if ceiling:
            found.append(TeamCounter(owners[scope], scope, metric, period, ceiling, tuple(sorted({name for name, _, _ in entries}))))
    return tuple(found)


def _calendar_limits(rule: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    limits = []
    quota = rule.get("quota") or {}
    if quota.get("tokens_per_day"):
        limits.append((TOKENS, DAY, int(quota["tokens_per_day"])))
    budget = rule.get("budget")
    if budget:
        limits.append((COST, _PERIODS[budget["period"]], micro_usd(str(budget["limit_usd"]))))
    return limits


def _ceiling(entries: list[tuple[str, str, int]]) -> int | None:
    """governance.rego's ``_merge``: the lowest Block limit, else the lowest Warn limit
    (a Warn limit only counts below the Block one, and a charge's ceiling is Block first)."""
    blocking = [limit for _, policy, limit in entries if policy == "Block"]
    if blocking:
        return min(blocking)
    warning = [limit for _, policy, limit in entries if policy == "Warn"]
    return min(warning) if warning else None
