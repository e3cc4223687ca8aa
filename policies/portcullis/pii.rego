# PII policy (seed §5.3). Policies name the teams they are mandatory for and what
# happens to each entity type; every policy that names a team applies, merged
# most-restrictively: per entity the strictest action (block, redact, tokenize,
# pseudonymize, mask), the union of detectors, the lowest score threshold, the
# egress fields every policy supports, block before internal routing, fail_closed
# before fail_open, and tokens restored only for principals every tokenizing policy
# names as a reader.
package portcullis.pii

default _policies := {}

_policies := data.portcullis.pii.policies

_actions_by_strictness := ["block", "redact", "tokenize", "pseudonymize", "mask"]

_default_fields := ["text", "tool_descriptions", "tool_arguments", "tool_results"]

# The plan's `pii`: the team's merged policy (from the per-bundle index when there is
# one) and whether this principal may see tokens restored; null when none applies.
for_principal(principal) := object.union(merged, {
	"restore_tokens": _reads_all_tokens(merged.policies, principal),
	"classifier": _classifier_within(merged.classifier, data.portcullis.access.entitlements(principal).regions),
}) if {
	merged := _team_pii(principal.team)
	merged != null
} else := null

# This package's part of the per-bundle index: every team's merged policy.
index := {team_id: _merged_pii(team_id) | some team_id, _ in data.portcullis.tenants.teams}

# The classifier reads the principal's raw text, so it obeys the principal's region lock.
_classifier_within(null, _) := null

_classifier_within(classifier, regions) := {"target": target, "max_output_tokens": classifier.max_output_tokens} if {
	classifier != null
	target := [t | some t in classifier.targets; data.portcullis.lib.target_within(regions, t)][0]
} else := null

_team_pii(team) := found if {
	found := data.portcullis.compiled.pii[team]
} else := _merged_pii(team)

_merged_pii(team) := _merge_pii(names) if {
	names := sort([name | some name, policy in _policies; data.portcullis.lib.covers(policy.teams, team)])
	count(names) > 0
} else := null

_merge_pii(names) := {
	"policies": names,
	"actions": {entity: _strictest_action(entity, policies) |
		some policy in policies
		some entity, _ in policy.actions
	},
	"detectors": sort({"patterns"} | {d | some policy in policies; some d in object.get(policy, "detectors", [])}),
	"min_score": min([object.get(policy, "min_score", 0.6) | some policy in policies]),
	"fields": sort(intersection({{f | some f in _supported_fields(policy)} | some policy in policies})),
	"unsupported": _unsupported_action(policies),
	"on_error": _error_policy(policies),
	"classifier": _classifier_for(policies),
} if {
	policies := [_policies[name] | some name in names]
}

# The classifier reads raw text, so it runs only on internal targets of the model the
# bundle names; without one the plan has none and the detector fails.
_classifier_for(policies) := {"targets": targets, "max_output_tokens": object.get(config, "max_output_tokens", 512)} if {
	some policy in policies
	"classifier" in object.get(policy, "detectors", [])
	config := data.portcullis.pii.classifier
	targets := [candidate | some candidate in data.portcullis.routing.candidates(config.model); candidate.internal == true]
	count(targets) > 0
} else := null

_strictest_action(entity, policies) := [action |
	some action in _actions_by_strictness
	some policy in policies
	policy.actions[entity] == action
][0]

_supported_fields(policy) := object.get(object.get(policy, "scope", {}), "supported_egress_fields", _default_fields)

_unsupported_action(policies) := "block" if {
	some policy in policies
	object.get(object.get(policy, "scope", {}), "unsupported_sensitive_content", "block") == "block"
} else := "internal"

_error_policy(policies) := "fail_closed" if {
	some policy in policies
	object.get(policy, "on_error", "fail_closed") == "fail_closed"
} else := "fail_open"

_reads_all_tokens(names, principal) if {
	every name in names {
		_reads_tokens(_policies[name], principal)
	}
}

_reads_all_tokens(names, principal) := false if {
	some name in names
	not _reads_tokens(_policies[name], principal)
}

_reads_tokens(policy, _) if {
	not _tokenizes(policy)
}

_reads_tokens(policy, principal) if {
	_tokenizes(policy)
	some reader in object.get(policy, "token_readers", [])
	reader in _readers_matching(principal)
}

_readers_matching(principal) := {concat("/", [principal.team, "*"]), concat("/", [principal.team, principal.user])} if {
	principal.user != null
} else := {concat("/", [principal.team, "*"])}

_tokenizes(policy) if {
	some action in policy.actions
	action == "tokenize"
}
