# Input-free precomputation. The gateway evaluates `compiled_index` once when it
# loads a bundle and stores the result at data.portcullis.compiled, so request-time
# checks are lookups instead of glob matches and sorts. The rules that read it
# compute the same values themselves when it is absent.
package portcullis

compiled_index := {
	"principals": {team_id: principal_index(team) | some team_id, team in data.portcullis.tenants.teams},
	"candidates": {model: candidates_of(model) | some model, _ in data.portcullis.catalog.models},
}

# "*" is the team itself; every user the bundle lists gets its own entry.
principal_index(team) := object.union(
	{"*": entitlements(team, {})},
	{user_id: entitlements(team, user) | some user_id, user in object.get(team, "users", {})},
)
