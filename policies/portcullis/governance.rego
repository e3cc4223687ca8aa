# Governance limits (seed §3.3). Every rule whose subject matches the principal applies,
# each to its own counter (the team's, the user's, the key's or the organisation's);
# rules that land on the same counter merge most-restrictively: the lowest Block limit
# and the lowest Warn limit below it (Block wins a tie). `unlimited: true` adds no
# limit and removes none; it is listed so the audit log shows the exemption.
package portcullis.governance

_budget_periods := {"CalendarMonth": "month", "CalendarDay": "day"}

# What a principal may use at most, whichever counter imposes it: the merged view.
_effective_dimensions := [
	["requests", "minute", "requests_per_minute"],
	["tokens", "minute", "tokens_per_minute"],
	["tokens", "day", "tokens_per_day"],
	["cost", "day", "usd_per_day"],
	["cost", "month", "usd_per_month"],
]

default _rules := {}

_rules := data.portcullis.governance.rules

# The plan's `limits`. The per-bundle index holds every team's merged limits, computed
# once with `{user}` and `{key}` standing for the request's ids in per-user and per-key
# scopes (the gateway fills them in); only keys that rules name one by one are merged
# per request.
limits(principal) := found if {
	not data.portcullis.compiled.named_keys[principal.key_id]
	team_limits := data.portcullis.compiled.limits[principal.team]
	found := _indexed_limits(team_limits, principal.user)
} else := _merged_limits(principal)

# This package's part of the per-bundle index: the rules that can apply to each team,
# each team's merged limits and the keys rules name one by one.
index := {
	"rules_by_team": {team_id: _team_rules(team_id) | some team_id, _ in data.portcullis.tenants.teams},
	"limits": {team_id: _team_limits(team_id) | some team_id, _ in data.portcullis.tenants.teams},
	"named_keys": {rule.subject.key: true | some rule in _rules; rule.subject.key},
}

# A team's merged limits: `team` serves a user no rule names, `keyless` a key with no
# user, `users` the users rules name. Names live in a map of their own, so no user
# name (not even "-" or "*") can stand for a placeholder; the `{user}` and `{key}`
# in scopes become the request's own ids (limits).
_team_limits(team) := {
	"team": _merged_limits({"team": team, "user": "{user}", "key_id": "{key}"}),
	"keyless": _merged_limits({"team": team, "user": null, "key_id": "{key}"}),
	"users": {user: _merged_limits({"team": team, "user": user, "key_id": "{key}"}) |
		some rule in _rules
		rule.subject.team == team
		user := rule.subject.user
	},
}

_indexed_limits(team_limits, null) := team_limits.keyless

_indexed_limits(team_limits, user) := object.get(team_limits.users, user, team_limits.team) if user != null

_merged_limits(principal) := {
	"counters": counters,
	"unlimited": sort([name | some name in names; _rules[name].unlimited == true]),
	"effective": {label: limit |
		some [metric, period, label] in _effective_dimensions
		limit := _strictest([{"limit": c.block} | some c in counters; c.metric == metric; c.period == period; c.block != null])
		limit != null
	},
} if {
	names := [name | some name in _rules_of_team(principal.team); _applies(_rules[name].subject, principal)]
	entries := [entry | some name in names; some entry in _rule_entries(name, _rules[name], principal)]
	counters := [_merge([e | some e in entries; e.id == id]) | some id in {e.id | some e in entries}]
}

# Rules that can apply to a team's principals; the per-bundle index holds the answer.
_rules_of_team(team) := found if {
	found := data.portcullis.compiled.rules_by_team[team]
} else := _team_rules(team)

_team_rules(team) := [name |
	some name, rule in _rules
	object.get(rule.subject, "team", team) == team
]

# A subject's missing fields match anything.
_applies(subject, principal) if {
	object.get(subject, "team", principal.team) == principal.team
	object.get(subject, "user", principal.user) == principal.user
	object.get(subject, "key", principal.key_id) == principal.key_id
}

_rule_entries(name, rule, principal) := [object.union(limit, {
	"id": concat("|", [scope, limit.metric, limit.period]),
	"scope": scope,
	"rule": name,
	"policy": object.get(rule, "failure_policy", "Block"),
}) |
	scope := _scope_of(rule.subject, principal)
	some limit in _rule_limits(rule)
]

_rule_limits(rule) := array.concat(
	array.concat(
		[{"metric": "requests", "period": "minute", "limit": rule.rate.rpm, "hard": true} | rule.rate.rpm],
		[{"metric": "tokens", "period": "minute", "limit": rule.rate.tpm, "hard": true} | rule.rate.tpm],
	),
	array.concat(
		[{"metric": "tokens", "period": "day", "limit": rule.quota.tokens_per_day, "hard": true} | rule.quota.tokens_per_day],
		[{
			"metric": "cost",
			"period": _budget_periods[rule.budget.period],
			"limit": rule.budget.limit_usd,
			"hard": object.get(rule.budget, "hard_cap", true),
			"thresholds": object.get(rule.budget, "thresholds", [80, 95]),
		} |
			rule.budget
		],
	),
)

# Whose counter a rule charges. `per: user` (or `per: key`) gives every user (or key)
# the subject covers a counter of its own; a key with no user counts on its own.
_scope_of(subject, principal) := concat("", ["key:", principal.key_id]) if {
	subject.per == "key"
} else := concat("", ["user:", principal.team, "/", principal.user]) if {
	subject.per == "user"
	principal.user != null
} else := concat("", ["key:", principal.key_id]) if {
	subject.per == "user"
} else := concat("", ["key:", subject.key]) if {
	subject.key
} else := concat("", ["user:", subject.team, "/", subject.user]) if {
	subject.user
} else := concat("", ["team:", subject.team]) if {
	subject.team
} else := "org"

_merge(group) := {
	"scope": group[0].scope,
	"metric": group[0].metric,
	"period": group[0].period,
	"block": block,
	"warn": warn,
	"hard": count([e | some e in blocking; e.limit == block; e.hard]) > 0,
	"rules": sort({e.rule | some e in group}),
	"thresholds": sort({t | some e in governing; some t in object.get(e, "thresholds", [])}),
} if {
	blocking := [e | some e in group; e.policy == "Block"]
	block := _strictest(blocking)
	warn := _below(_strictest([e | some e in group; e.policy == "Warn"]), block)

	# A counter's nature and alerts come from the rules whose limit governs it, so a
	# stricter soft cap does not harden a looser hard one, and each rule's percentages
	# stay percentages of its own limit.
	ceiling := _first_non_null([block, warn])
	governing := [e | some e in group; e.limit == ceiling]
}

_first_non_null(values) := [v | some v in values; v != null][0]

# The lowest limit among entries, as written (budgets are decimal strings), or null.
_strictest(entries) := null if {
	count(entries) == 0
} else := ranked[0][1] if {
	ranked := sort([[to_number(e.limit), e.limit] | some e in entries])
}

# A warning level only matters below the blocking level: Block wins a tie.
_below(warn, block) := null if {
	warn == null
} else := warn if {
	block == null
} else := warn if {
	to_number(warn) < to_number(block)
} else := null
