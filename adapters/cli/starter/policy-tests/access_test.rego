# Who may use which model, and where: the starter data as shipped (no mocks), so a data
# change that moves these decisions fails here first. Run from the repository's root:
#   portcullis policy test policies policy-tests --coverage --threshold 70
# docs/policies.md, "Testing policies".
package portcullis.access_test

# The input document the gateway builds for a request (docs/policies.md, "The decision").
request(team, user, model) := {
	"principal": {"team": team, "user": user, "key_id": "key_test"},
	"request": {"protocol": "anthropic_messages", "model": model, "stream": false, "max_tokens": 100, "requires": [], "tools": []},
}

decide(team, user, model) := plan if {
	plan := data.portcullis.decision with input as request(team, user, model)
}

providers(plan) := [t.provider | some t in plan.targets]

test_platform_gets_sonnet_from_bedrock_first if {
	plan := decide("platform", "alice", "sonnet")
	plan.allow
	plan.model == "claude-sonnet-4-5" # the alias resolved
	providers(plan) == ["bedrock", "anthropic", "bedrock", "anthropic"] # own targets, then the fallback's
}

test_a_team_the_bundle_does_not_list_is_refused if {
	decide("marketing", null, "haiku").reasons[0].code == "unknown_team"
}

test_support_is_refused_a_model_it_is_not_granted if {
	plan := decide("support", "sam", "claude-sonnet-4-5")
	not plan.allow
	plan.reasons[0].code == "model_not_allowed"
}

test_a_user_entry_narrows_its_team if {
	decide("platform", "intern", "sonnet").reasons[0].code == "model_not_allowed"
	decide("platform", "intern", "haiku").allow
}

test_the_region_lock_keeps_support_in_the_eu if {
	plan := decide("support", "sam", "haiku")
	plan.allow
	[t.region | some t in plan.targets] == ["eu-central-1"]
	[[r.provider, r.reasons] | some r in plan.rejected_targets] == [["anthropic", ["region_not_allowed"]]]
}

test_visible_models_follow_the_grants if {
	models := data.portcullis.visible_models with input as {"principal": {"team": "support", "user": "sam"}}
	models == ["claude-haiku-4-5"]
}

# The gateway serves from the per-bundle index (data.portcullis.compiled); tests without
# it take the path that computes the same values per request. Both must agree. Each side
# is bound on its own: a `with` applies to the whole expression, both sides of an `==`.
test_the_index_gives_the_same_decisions if {
	index := data.portcullis.compiled_index
	every team in ["platform", "support"] {
		every model in ["sonnet", "haiku", "mini"] {
			indexed := decide(team, "sam", model) with data.portcullis.compiled as index
			computed := decide(team, "sam", model)
			filled(indexed, "sam", "key_test") == computed
		}
	}
}

# The index's limits keep `{user}` and `{key}` in per-user and per-key scopes; the
# gateway puts the request's ids in their place, as here.
filled(plan, user, key) := object.union(plan, {"limits": {"counters": [object.union(c, {"scope": replace(replace(c.scope, "{user}", user), "{key}", key)}) |
	some c in plan.limits.counters
]}})
