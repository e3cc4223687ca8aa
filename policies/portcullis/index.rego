# Input-free precomputation. The gateway evaluates `compiled_index` once when it
# loads a bundle and stores the result at data.portcullis.compiled, so request-time
# checks are lookups instead of glob matches and sorts. The rules that read it
# compute the same values themselves when it is absent.
package portcullis

compiled_index := {
	"principals": {team_id: principal_index(team) | some team_id, team in data.portcullis.tenants.teams},
	"candidates": {model: candidates_of(model) | some model, _ in data.portcullis.catalog.models},
	"rules_by_team": {team_id: team_rules(team_id) | some team_id, _ in data.portcullis.tenants.teams},
	"limits": {team_id: team_limits(team_id) | some team_id, _ in data.portcullis.tenants.teams},
	"named_keys": {rule.subject.key: true | some rule in governance_rules; rule.subject.key},
	"pii": {team_id: merged_pii(team_id) | some team_id, _ in data.portcullis.tenants.teams},
	"integrity": {team_id: merged_integrity(team_id) | some team_id, _ in data.portcullis.tenants.teams},
}

# A team's merged limits: `team` serves a user no rule names, `keyless` a key with no
# user, `users` the users rules name. Names live in a map of their own, so no user
# name (not even "-" or "*") can stand for a placeholder; the `{user}` and `{key}`
# in scopes become the request's own ids (limits_for).
team_limits(team) := {
	"team": merged_limits({"team": team, "user": "{user}", "key_id": "{key}"}),
	"keyless": merged_limits({"team": team, "user": null, "key_id": "{key}"}),
	"users": {user: merged_limits({"team": team, "user": user, "key_id": "{key}"}) |
		some rule in governance_rules
		rule.subject.team == team
		user := rule.subject.user
	},
}

# `team` serves a user the bundle does not list; every listed user gets its own entry.
principal_index(team) := {
	"team": entitlements(team, {}),
	"users": {user_id: entitlements(team, user) | some user_id, user in object.get(team, "users", {})},
}
