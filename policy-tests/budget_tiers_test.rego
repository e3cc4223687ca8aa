# L3 budget tiers (budget_tiers.rego): the highest tier a team's named budget has
# reached substitutes the model, the substitute is re-authorised by decision.rego, and
# nothing applies without a fact or to another team.
package portcullis_budget_tiers_test

target(provider, model, region) := {
	"provider": provider, "model": model, "region": region, "priority": 1,
	"context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming"],
}

catalog := {
	"aliases": {},
	"models": {
		"claude-sonnet-4-5": {"targets": [target("anthropic", "claude-sonnet-4-5-20250929", "us-east-1")]},
		"claude-haiku-4-5": {"targets": [target("anthropic", "claude-haiku-4-5-20251001", "us-east-1")]},
		"glm-4.6": {"targets": [target("vllm", "zai-org/GLM-4.6", "ap-northeast-2")]},
	},
	"prices": [],
}

tenants := {"teams": {
	"payments": {"models": ["claude-*", "glm-*"], "regions": ["us-east-1", "ap-northeast-2"]},
	"locked": {"models": ["claude-*", "glm-*"], "regions": ["us-east-1"]},
	"sonnet-only": {"models": ["claude-sonnet-*"], "regions": ["us-east-1"]},
	"research": {"models": ["claude-*"], "regions": ["us-east-1"]},
}}

payments_tiers := {
	"budget": "payments-monthly",
	"tiers": [
		{"name": "yellow", "threshold_percent": 80, "substitutions": {"claude-sonnet-4-5": "glm-4.6"}},
		{"name": "red", "threshold_percent": 95, "substitutions": {"claude-sonnet-4-5": "claude-haiku-4-5", "glm-4.6": "claude-haiku-4-5"}},
	],
}

tiers := {"teams": {
	"payments": payments_tiers,
	"locked": object.union(payments_tiers, {"budget": "locked-monthly"}),
	"sonnet-only": object.union(payments_tiers, {"budget": "sonnet-only-monthly"}),
	"*": {"budget": "org-monthly", "tiers": [{"name": "org-red", "threshold_percent": 90, "substitutions": {"claude-sonnet-4-5": "claude-haiku-4-5"}}]},
}}

at(team, percent) := {"budgets": {budget: {"percent": percent} | some budget in [tiers.teams[team].budget, "org-monthly"]}}

proposal(team, model, facts) := found if {
	found := data.portcullis.budget_tiers.proposal({"team": team, "user": null, "key_id": "k"}, {"model": model}, model, facts) with data.portcullis.budget_tiers as tiers
}

decide(team, facts) := plan if {
	plan := data.portcullis.decision with input as {
		"principal": {"team": team, "user": null, "key_id": "k"},
		"request": {"protocol": "anthropic_messages", "model": "claude-sonnet-4-5", "stream": false, "requires": []},
		"facts": facts,
	}
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
		with data.portcullis.budget_tiers as tiers
		with data.portcullis.governance as {"rules": {}}
}

test_below_the_first_threshold_no_tier_applies if {
	proposal("payments", "claude-sonnet-4-5", at("payments", 79)) == null
}

test_each_threshold_is_reached_at_its_percent if {
	proposal("payments", "claude-sonnet-4-5", at("payments", 80)) == {"model": "glm-4.6", "tier": "yellow", "budget": "payments-monthly", "threshold_percent": 80}
	proposal("payments", "claude-sonnet-4-5", at("payments", 94)).tier == "yellow"
	proposal("payments", "claude-sonnet-4-5", at("payments", 95)) == {"model": "claude-haiku-4-5", "tier": "red", "budget": "payments-monthly", "threshold_percent": 95}
	proposal("payments", "claude-sonnet-4-5", at("payments", 140)).tier == "red"
}

test_a_tier_that_does_not_name_the_model_leaves_it if {
	proposal("payments", "glm-4.6", at("payments", 90)) == null
	proposal("payments", "glm-4.6", at("payments", 95)).model == "claude-haiku-4-5"
	proposal("payments", "claude-haiku-4-5", at("payments", 100)) == null
}

rank(null) := 0

rank(p) := p.threshold_percent if p != null

test_a_rising_utilisation_never_lowers_the_tier if {
	ranks := [rank(proposal("payments", "claude-sonnet-4-5", at("payments", percent))) | some percent in numbers.range(0, 100)]
	every i in numbers.range(1, 100) {
		ranks[i - 1] <= ranks[i]
	}
	ranks[100] == 95
}

test_no_facts_means_no_tier if {
	proposal("payments", "claude-sonnet-4-5", {}) == null
	proposal("payments", "claude-sonnet-4-5", {"budgets": {}}) == null
	proposal("payments", "claude-sonnet-4-5", {"budgets": {"another-budget": {"percent": 100}}}) == null
}

test_another_teams_tiers_do_not_apply if {
	# research has no entry of its own: only "*" (the org budget) can apply to it
	proposal("research", "claude-sonnet-4-5", {"budgets": {"payments-monthly": {"percent": 100}}}) == null
	proposal("research", "claude-sonnet-4-5", {"budgets": {"org-monthly": {"percent": 90}}}).tier == "org-red"
}

test_a_teams_own_tiers_replace_everyones if {
	proposal("payments", "claude-sonnet-4-5", {"budgets": {"org-monthly": {"percent": 100}}}) == null
}

test_a_reached_tier_serves_its_substitute if {
	plan := decide("payments", at("payments", 81))
	plan.allow
	plan.model == "glm-4.6"
	[t.model | some t in plan.targets] == ["zai-org/GLM-4.6"]
	plan.routing.substituted_from == "claude-sonnet-4-5"
	plan.routing.layer == "budget_tier"
	plan.routing.layers == [{
		"layer": "budget_tier", "from": "claude-sonnet-4-5", "to": "glm-4.6", "applied": true,
		"model": "glm-4.6", "tier": "yellow", "budget": "payments-monthly", "threshold_percent": 80,
	}]
}

test_a_substitute_the_team_may_not_use_keeps_the_model if {
	plan := decide("sonnet-only", at("sonnet-only", 96))
	plan.allow
	plan.model == "claude-sonnet-4-5"
	plan.routing.substituted_from == null
	plan.routing.layers[0].tier == "red"
	plan.routing.layers[0].applied == false
	plan.routing.layers[0].reasons == ["model_not_allowed"]
}

test_a_substitute_outside_the_region_lock_keeps_the_model if {
	plan := decide("locked", at("locked", 85))
	plan.allow
	plan.model == "claude-sonnet-4-5"
	plan.routing.layers[0].to == "glm-4.6"
	plan.routing.layers[0].applied == false
	plan.routing.layers[0].reasons == ["no_authorised_target"]
}

test_below_every_tier_the_plan_records_no_layer if {
	plan := decide("payments", at("payments", 79))
	plan.model == "claude-sonnet-4-5"
	plan.routing.layers == []
}
