# PII policy (seed §5.3). Policies name the teams they are mandatory for and what
# happens to each entity type; every policy that names a team applies, merged
# most-restrictively: per entity the strictest action (block, redact, tokenize,
# pseudonymize, mask), the union of detectors, the lowest score threshold, the
# egress fields every policy supports, block before internal routing, fail_closed
# before fail_open, and tokens restored only for principals every tokenizing policy
# names as a reader.
package portcullis

default pii_policies := {}

pii_policies := data.portcullis.pii.policies

pii_actions_by_strictness := ["block", "redact", "tokenize", "pseudonymize", "mask"]

pii_default_fields := ["text", "tool_descriptions", "tool_arguments", "tool_results"]

# The plan's `pii`: the team's merged policy (from the per-bundle index when there is
# one) and whether this principal may see tokens restored; null when none applies.
pii_for(principal) := object.union(merged, {
	"restore_tokens": reads_all_tokens(merged.policies, principal),
	"classifier": classifier_within(merged.classifier, entitlements_for(principal).regions),
}) if {
	merged := team_pii(principal.team)
	merged != null
} else := null

# The classifier reads the principal's raw text, so it obeys the principal's region lock.
classifier_within(null, _) := null

classifier_within(classifier, regions) := {"target": target, "max_output_tokens": classifier.max_output_tokens} if {
	classifier != null
	target := [t | some t in classifier.targets; region_within(regions, t.region)][0]
} else := null

team_pii(team) := found if {
	found := data.portcullis.compiled.pii[team]
} else := merged_pii(team)

merged_pii(team) := merge_pii(names) if {
	names := sort([name | some name, policy in pii_policies; covers(policy.teams, team)])
	count(names) > 0
} else := null

covers(teams, team) if team in teams

covers(teams, _) if "*" in teams

merge_pii(names) := {
	"policies": names,
	"actions": {entity: strictest_action(entity, policies) |
		some policy in policies
		some entity, _ in policy.actions
	},
	"detectors": sort({"patterns"} | {d | some policy in policies; some d in object.get(policy, "detectors", [])}),
	"min_score": min([object.get(policy, "min_score", 0.6) | some policy in policies]),
	"fields": sort(intersection({{f | some f in supported_fields(policy)} | some policy in policies})),
	"unsupported": unsupported_action(policies),
	"on_error": error_policy(policies),
	"classifier": classifier_for(policies),
} if {
	policies := [pii_policies[name] | some name in names]
}

# The classifier reads raw text, so it runs only on internal targets of the model the
# bundle names; without one the plan has none and the detector fails.
classifier_for(policies) := {"targets": targets, "max_output_tokens": object.get(config, "max_output_tokens", 512)} if {
	some policy in policies
	"classifier" in object.get(policy, "detectors", [])
	config := data.portcullis.pii.classifier
	targets := [candidate | some candidate in candidates_for(config.model); candidate.internal == true]
	count(targets) > 0
} else := null

strictest_action(entity, policies) := [action |
	some action in pii_actions_by_strictness
	some policy in policies
	policy.actions[entity] == action
][0]

supported_fields(policy) := object.get(object.get(policy, "scope", {}), "supported_egress_fields", pii_default_fields)

unsupported_action(policies) := "block" if {
	some policy in policies
	object.get(object.get(policy, "scope", {}), "unsupported_sensitive_content", "block") == "block"
} else := "internal"

error_policy(policies) := "fail_closed" if {
	some policy in policies
	object.get(policy, "on_error", "fail_closed") == "fail_closed"
} else := "fail_open"

reads_all_tokens(names, principal) if {
	every name in names {
		reads_tokens(pii_policies[name], principal)
	}
}

reads_all_tokens(names, principal) := false if {
	some name in names
	not reads_tokens(pii_policies[name], principal)
}

reads_tokens(policy, _) if {
	not tokenizes(policy)
}

reads_tokens(policy, principal) if {
	tokenizes(policy)
	some reader in object.get(policy, "token_readers", [])
	reader in readers_matching(principal)
}

readers_matching(principal) := {concat("/", [principal.team, "*"]), concat("/", [principal.team, principal.user])} if {
	principal.user != null
} else := {concat("/", [principal.team, "*"])}

tokenizes(policy) if {
	some action in policy.actions
	action == "tokenize"
}
