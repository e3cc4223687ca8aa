# L1 name resolution and L2 entitlements (RBAC + region lock). A user entry can only
# narrow what its team grants, never widen it; a user the bundle does not list has
# exactly the team's entitlements.
package portcullis

# Aliases resolve before RBAC so an alias can never dodge an allow-list. The bundle
# loader refuses an alias that shadows a canonical ID.
resolve(name) := model if {
	model := data.portcullis.catalog.aliases[name]
} else := name if {
	data.portcullis.catalog.models[name]
}

# {"models": {canonical ID: true}, "regions": {region: true}, or null when nothing
# limits them}. Objects rather than sets: the per-bundle index (compiled_index) that
# holds them is data, and data is JSON in every Rego engine (OPA reads a set stored
# there as an array, on which a keyed lookup is undefined). Glob matching is costly,
# so the gateway keeps that index at data.portcullis.compiled; without it (policy
# tests that mock data) it is computed here.
entitlements_for(principal) := found if {
	index := data.portcullis.compiled.principals[principal.team]
	found := object.get(index.users, principal.user, index.team)
} else := entitlements(
	data.portcullis.tenants.teams[principal.team],
	object.get(object.get(data.portcullis.tenants.teams[principal.team], "users", {}), principal.user, {}),
)

entitlements(team, user) := {
	"models": {model: true | some model in models_granted(team.models) & models_granted(object.get(user, "models", ["*"]))},
	"regions": region_scope(team, user),
}

# null delimiters: `*` also spans dots, so "glm-*" covers "glm-4.6".
models_granted(patterns) := {model |
	some model, _ in data.portcullis.catalog.models
	some pattern in patterns
	glob.match(pattern, null, model)
}

region_scope(team, user) := {r: true | some r in team.regions; r in user.regions} if {
	team.regions
	user.regions
} else := {r: true | some r in team.regions} if {
	team.regions
} else := {r: true | some r in user.regions} if {
	user.regions
} else := null

region_within(null, _) := true

region_within(regions, region) if regions[region]
