# L6 circuit breakers in the decision (decision.rego `_serve`, breakers.rego): a target
# whose breaker is open is not authorised; a half-open one stays; a breaker never adds
# a target; when every otherwise-authorised target is open the request is refused with
# targets_unavailable and the moment the first one half-opens.
package portcullis_breakers_test

target(provider, model, region, priority) := {
	"provider": provider, "model": model, "region": region, "priority": priority,
	"context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming"],
}

catalog := {
	"aliases": {},
	"models": {
		"claude-sonnet-4-5": {
			"targets": [
				target("anthropic-us", "claude-sonnet-4-5-20250929", "us-east-1", 1),
				target("bedrock-eu", "anthropic.claude-sonnet-4-5-v1:0", "eu-central-1", 2),
			],
			"fallbacks": ["claude-haiku-4-5"],
		},
		"claude-haiku-4-5": {"targets": [target("anthropic-us", "claude-haiku-4-5-20251001", "us-east-1", 1)]},
	},
	"prices": [],
}

tenants := {"teams": {
	"research": {"models": ["*"]},
	"us-only": {"models": ["claude-sonnet-*"], "regions": ["us-east-1"]},
}}

us := "anthropic-us/claude-sonnet-4-5-20250929@us-east-1"

eu := "bedrock-eu/anthropic.claude-sonnet-4-5-v1:0@eu-central-1"

haiku := "anthropic-us/claude-haiku-4-5-20251001@us-east-1"

decide(team, breakers) := plan if {
	request := {
		"principal": {"team": team, "user": null, "key_id": "k"},
		"request": {"model": "claude-sonnet-4-5", "protocol": "anthropic_messages", "stream": false},
		"facts": {"breakers": breakers},
	}
	plan := data.portcullis.decision with input as request with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
}

regions(plan) := [t.region | some t in plan.targets]

test_an_open_breaker_leaves_its_target_out if {
	plan := decide("research", {us: {"state": "open", "until": 1764600030}})
	plan.allow
	[t.model | some t in plan.targets] == ["anthropic.claude-sonnet-4-5-v1:0", "claude-haiku-4-5-20251001"]
	plan.rejected_targets == [object.union(catalog.models["claude-sonnet-4-5"].targets[0], {"canonical_model": "claude-sonnet-4-5", "reasons": ["breaker_open"]})]
}

test_a_half_open_breaker_keeps_its_target_in_place if {
	plan := decide("research", {us: {"state": "half_open"}})
	regions(plan) == ["us-east-1", "eu-central-1", "us-east-1"]
	plan.rejected_targets == []
}

test_no_facts_means_every_breaker_is_closed if {
	request := {
		"principal": {"team": "research", "user": null, "key_id": "k"},
		"request": {"model": "claude-sonnet-4-5", "protocol": "anthropic_messages", "stream": false},
	}
	plan := data.portcullis.decision with input as request with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
	count(plan.targets) == 3
}

test_a_closed_breaker_never_adds_a_target if {
	# eu is outside us-only's region lock: no breaker state brings it back
	plan := decide("us-only", {us: {"state": "open", "until": 1764600030}})
	not plan.allow
	plan.reasons[0].code == "targets_unavailable"
	[r.reasons | some r in plan.rejected_targets] == [["breaker_open"], ["region_not_allowed"], ["model_not_allowed"]]
}

test_every_target_open_is_unavailable_until_the_first_half_opens if {
	plan := decide("research", {
		us: {"state": "open", "until": 1764600090},
		eu: {"state": "open", "until": 1764600030},
		haiku: {"state": "open", "until": 1764600060},
	})
	not plan.allow
	plan.targets == []
	plan.reasons == [{
		"code": "targets_unavailable",
		"message": "every target of the requested model is unavailable right now (circuit breakers open); try again later",
		"retry_at": 1764600030,
	}]
	[r.reasons | some r in plan.rejected_targets] == [["breaker_open"], ["breaker_open"], ["breaker_open"]]
}

test_a_target_refused_by_policy_and_open_is_not_unavailable if {
	# only us-east-1 is the team's, and it is refused for its model too: the refusal is the policy's
	plan := decide("us-only", {eu: {"state": "open", "until": 1764600030}})
	plan.allow
	regions(plan) == ["us-east-1"]
	[r.reasons | some r in plan.rejected_targets] == [["region_not_allowed", "breaker_open"], ["model_not_allowed"]]
}

test_an_open_fallback_still_leaves_the_model_served if {
	plan := decide("research", {haiku: {"state": "open", "until": 1764600030}})
	plan.allow
	regions(plan) == ["us-east-1", "eu-central-1"]
}
