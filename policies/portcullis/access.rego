# L1 name resolution and L2 entitlements (RBAC + region lock). A user entry can only
# narrow what its team grants, never widen it; a user the bundle does not list has
# exactly the team's entitlements.
package portcullis.access

# Aliases resolve before RBAC so an alias can never dodge an allow-list. The bundle
# loader refuses an alias that shadows a canonical ID.
resolve(name) := model if {
	model := data.portcullis.catalog.aliases[name]
} else := name if {
	data.portcullis.catalog.models[name]
}

# {"models": {canonical ID: true}, "regions": {region: true}, or null when nothing
# limits them}. Objects rather than sets: the per-bundle index that holds them is
# data, and data is JSON in every Rego engine (OPA reads a set stored there as an
# array, on which a keyed lookup is undefined). Glob matching is costly, so the
# gateway keeps that index at data.portcullis.compiled; without it (policy tests that
# mock data) it is computed here.
entitlements(principal) := found if {
	indexed := data.portcullis.compiled.principals[principal.team]
	found := object.get(indexed.users, principal.user, indexed.team)
} else := _entitlements(
	data.portcullis.tenants.teams[principal.team],
	object.get(object.get(data.portcullis.tenants.teams[principal.team], "users", {}), principal.user, {}),
)

# This package's part of the per-bundle index. Per team, `team` serves a user the
# bundle does not list; every listed user gets its own entry.
index := {team_id: {
	"team": _entitlements(team, {}),
	"users": {user_id: _entitlements(team, user) | some user_id, user in object.get(team, "users", {})},
} |
	some team_id, team in data.portcullis.tenants.teams
}

_entitlements(team, user) := {
	"models": {model: true | some model in _models_granted(team.models) & _models_granted(object.get(user, "models", ["*"]))},
	"regions": _region_scope(team, user),
}

# null delimiters: `*` also spans dots, so "glm-*" covers "glm-4.6".
_models_granted(patterns) := {model |
	some model, _ in data.portcullis.catalog.models
	some pattern in patterns
	# portcullis-lint: ignore catalog-glob-scan -- runs only without the per-bundle index (policy tests mocking data): the gateway serves entitlements from data.portcullis.compiled.principals, which compiled_index builds with this once per bundle
	glob.match(pattern, null, model)
}

_region_scope(team, user) := {r: true | some r in team.regions; r in user.regions} if {
	team.regions
	user.regions
} else := {r: true | some r in team.regions} if {
	team.regions
} else := {r: true | some r in user.regions} if {
	user.regions
} else := null
