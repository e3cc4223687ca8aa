# Prompt integrity (seed §7). Per team: the policy prompt the gateway inserts (layer A),
# the sources it wraps as untrusted (B), where injection findings warn or block (C),
# which tool calls the model may make (D) and what the output guard does (E). Every
# policy that names a team applies, merged most-restrictively: every prompt, in name
# order; every spotlight source; per surface the strictest action and the lowest
# score threshold; each policy's tool allow-list must admit a call and every deny
# rule applies; per output finding the strictest action and every host allow-list.
package portcullis.integrity

default _policies := {}

_policies := data.portcullis.integrity.policies

default _injection_rules := []

_injection_rules := data.portcullis.integrity.injection_rules

default _tool_rules := {}

_tool_rules := {rule.id: rule | some rule in data.portcullis.integrity.tool_rules}

_injection_actions_by_strictness := ["block", "warn"]

_output_actions_by_strictness := ["withhold", "redact", "flag"]

# The plan's `integrity`: the team's merged policies (from the per-bundle index when
# there is one); null when none applies.
for_principal(principal) := _team_integrity(principal.team)

# This package's part of the per-bundle index: every team's merged policies.
index := {team_id: _merged_integrity(team_id) | some team_id, _ in data.portcullis.tenants.teams}

_team_integrity(team) := found if {
	found := data.portcullis.compiled.integrity[team]
} else := _merged_integrity(team)

_merged_integrity(team) := _merge_integrity([_policies[name] | some name in names], names) if {
	names := sort([name | some name, policy in _policies; data.portcullis.lib.covers(policy.teams, team)])
	count(names) > 0
} else := null

_merge_integrity(policies, names) := {
	"policies": names,
	"prompt": _merged_prompt(policies, names),
	"spotlight": sort({source | some policy in policies; some source in object.get(policy, "spotlight", [])}),
	"injection": {
		"surfaces": {surface: _surface_action(policies, surface) |
			some policy in policies
			some surface, _ in policy.injection.surfaces
		},
		# per surface, the lowest threshold among the policies that scan it
		"thresholds": {surface: min([object.get(p.injection, "threshold", 3) | some p in policies; p.injection.surfaces[surface]]) |
			some policy in policies
			some surface, _ in policy.injection.surfaces
		},
	},
	"tools": {
		"allow": [p.tools.allow | some p in policies; p.tools.allow],
		"deny": sort({rule | some p in policies; some rule in object.get(object.get(p, "tools", {}), "deny", [])}),
		"declared_only": _declared_only(policies),
	},
	"output": {
		"actions": {finding: _output_action(policies, finding) |
			some policy in policies
			some finding, _ in policy.output.actions
		},
		# every policy that judges URLs keeps its own list; one without a list exempts no host
		"allowed_hosts": [object.get(p.output, "allowed_hosts", []) | some p in policies; p.output.actions.urls],
	},
}

_surface_action(policies, surface) := [action |
	some action in _injection_actions_by_strictness
	some policy in policies
	policy.injection.surfaces[surface] == action
][0]

_output_action(policies, finding) := [action |
	some action in _output_actions_by_strictness
	some policy in policies
	policy.output.actions[finding] == action
][0]

_declared_only(policies) if {
	some policy in policies
	policy.tools.declared_only == true
} else := false

_merged_prompt(policies, names) := {
	"version": concat(",", [sprintf("%s@%v", [names[i], p.prompt.version]) | some i, p in policies; p.prompt]),
	"text": concat("\n\n", [trim_space(p.prompt.text) | some p in policies; p.prompt]),
	"canaries": [p.prompt.canary | some p in policies; p.prompt.canary],
} if {
	some policy in policies
	policy.prompt
} else := null

# A request may not offer a tool the team's allow-lists refuse: a mandatory policy
# refuses the request rather than silently dropping the tool.
tools_refused(null, _) := []

tools_refused(integrity, tools) := sort({name |
	some name in tools
	_refuses_tool(integrity.tools, name)
}) if integrity != null

_refuses_tool(tools, name) if {
	some patterns in tools.allow
	not _name_matches(patterns, name)
}

# A tool the provider runs ("server:<name>") or an MCP server it connects to
# ("mcp:<name>") acts before the gateway sees a call, so a policy that judges calls
# cannot allow it.
_refuses_tool(tools, name) if {
	_provider_run(name)
	_judges_calls(tools)
}

_provider_run(name) if startswith(name, "mcp:")

_provider_run(name) if startswith(name, "server:")

_judges_calls(tools) if count(tools.deny) > 0

_judges_calls(tools) if tools.declared_only

# --- layer C: the injection scanner ---------------------------------------------------
# Each text's matched rules and their summed weight; the gateway evaluates this for
# the texts it has not scanned before and judges the score against the plan.
scan(text) := {"rules": [rule.id | some rule in hits], "score": sum([rule.weight | some rule in hits])} if {
	hits := [rule | some rule in _injection_rules; regex.match(rule.pattern, text)]
}

# --- layer D: tool calls the model makes ---------------------------------------------
# input: {principal, calls: [{name, arguments}], declared: [names the request offered]}.
verdict(principal, call) := _verdict(_team_integrity(principal.team).tools, call)

_verdict(tools, call) := {"allow": false, "rule": "tool_not_allowed", "message": "the tool is not on this team's allow-list"} if {
	some patterns in tools.allow
	not _name_matches(patterns, call.name)
} else := {"allow": false, "rule": "tool_not_declared", "message": "the request did not offer this tool"} if {
	tools.declared_only
	not call.name in input.declared
} else := {"allow": false, "rule": hits[0].id, "message": hits[0].message} if {
	hits := [rule | some id in tools.deny; rule := _tool_rules[id]; _denies(rule, call)]
	count(hits) > 0
} else := {"allow": true, "rule": null, "message": null}

_name_matches(patterns, name) if {
	some pattern in patterns
	glob.match(pattern, null, name) # null: no separators, so * matches dots too
}

_denies(rule, call) if {
	_name_matches(rule.tools, call.name)
	some value in _argument_values(rule.argument, call.arguments)
	regex.match(rule.pattern, value)
}

# "*": every string anywhere in the arguments; otherwise the named top-level argument.
_argument_values(name, arguments) := [value | walk(arguments, [_, value]); is_string(value)] if {
	name == "*"
} else := [arguments[name]] if {
	is_string(arguments[name])
} else := []
