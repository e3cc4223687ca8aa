# Region locks over targets that may route to several regions (Bedrock cross-region
# inference profiles): `portcullis policy test policies policy-tests`.
package portcullis.regions_test

apac := ["ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1", "ap-southeast-1", "ap-southeast-2"]

target(provider, model, region, priority) := {
	"provider": provider, "model": model, "region": region, "priority": priority,
	"context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming"],
}

# The reference routing: Bedrock Seoul through an `apac.` profile, Bedrock Oregon, then Anthropic direct.
catalog := {
	"aliases": {},
	"models": {"claude-sonnet-4-5": {"targets": [
		object.union(target("bedrock-apne2", "apac.anthropic.claude-sonnet-4-5-20250929-v1:0", "ap-northeast-2", 1), {"regions": apac}),
		target("bedrock-usw2", "anthropic.claude-sonnet-4-5-20250929-v1:0", "us-west-2", 2),
		target("anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 3),
	]}},
	"prices": [],
}

tenants := {"teams": {
	"apac-only": {"models": ["*"], "regions": apac},
	"seoul-only": {"models": ["*"], "regions": ["ap-northeast-2"]},
	"seoul-and-us": {"models": ["*"], "regions": ["ap-northeast-2", "us-west-2", "us-east-1"]},
	"anywhere": {"models": ["*"]},
}}

decide(team) := plan if {
	request := {
		"principal": {"team": team, "user": null, "key_id": "k"},
		"request": {"model": "claude-sonnet-4-5", "requires": [], "protocol": "anthropic_messages", "stream": false},
	}
	plan := data.portcullis.decision with input as request with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
}

providers(plan) := [t.provider | some t in plan.targets]

test_a_null_lock_admits_every_target_in_priority_order if {
	providers(decide("anywhere")) == ["bedrock-apne2", "bedrock-usw2", "anthropic"]
}

test_a_profile_whose_whole_set_is_inside_the_lock_is_admitted if {
	plan := decide("apac-only")
	providers(plan) == ["bedrock-apne2"]
	plan.targets[0].regions == apac # the plan carries the set, for the audit record
}

test_a_profile_partly_outside_the_lock_is_rejected_though_its_home_region_is_inside if {
	plan := decide("seoul-and-us")
	providers(plan) == ["bedrock-usw2", "anthropic"]
	some rejected in plan.rejected_targets
	rejected.provider == "bedrock-apne2"
	rejected.reasons == ["region_not_allowed"]
}

test_a_lock_that_admits_nothing_is_a_refusal if {
	plan := decide("seoul-only")
	plan.reasons[0].code == "no_authorised_target"
	[r.reasons | some r in plan.rejected_targets] == [["region_not_allowed"], ["region_not_allowed"], ["region_not_allowed"]]
}

visible(team) := models if {
	models := data.portcullis.visible_models with input as {"principal": {"team": team, "user": null}}
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
}

test_visible_models_use_the_whole_set if {
	visible("apac-only") == ["claude-sonnet-4-5"]
	visible("seoul-only") == []
}

test_the_index_gives_the_same_decisions if {
	index := data.portcullis.compiled_index with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
	every team in ["apac-only", "seoul-only", "seoul-and-us", "anywhere"] {
		indexed := decide(team) with data.portcullis.compiled as index # its own expression: a `with` covers both sides of an `==`
		computed := decide(team)
		indexed == computed
	}
}
