# Bedrock guardrails required by policy, per team and per model, merged so that no
# request gets a weaker one than either requires: `portcullis policy test policies policy-tests`.
package portcullis.guardrails_test

strict := {"identifier": "gr0strict", "version": "3"}

strict_too := {"identifier": "gr0strict", "version": "3"}

lenient := {"identifier": "gr0lenient", "version": "DRAFT"}

target(provider, model) := {
	"provider": provider, "model": model, "region": "us-west-2", "priority": 1,
	"context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming"],
}

catalog := {
	"aliases": {},
	"models": {
		"plain": {"targets": [target("bedrock", "plain-v1")]},
		"guarded": {"targets": [target("bedrock", "guarded-v1")], "guardrail": strict_too},
		"lenient": {"targets": [target("bedrock", "lenient-v1")], "guardrail": lenient},
		# its fallback requires another guardrail, so it can never serve this model's requests
		"guarded-then-lenient": {"targets": [target("bedrock", "gtl-v1")], "guardrail": strict, "fallbacks": ["lenient", "plain"]},
		"plain-then-lenient": {"targets": [target("bedrock", "ptl-v1")], "fallbacks": ["lenient"]},
	},
	"prices": [],
}

tenants := {"teams": {
	"open": {"models": ["*"]},
	"careful": {"models": ["*"], "guardrail": strict},
}}

decide(team, model) := plan if {
	request := {
		"principal": {"team": team, "user": null, "key_id": "k"},
		"request": {"model": model, "requires": [], "protocol": "anthropic_messages", "stream": false},
	}
	plan := data.portcullis.decision with input as request with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
}

test_nothing_required_is_a_null_guardrail if {
	plan := decide("open", "plain")
	plan.allow
	plan.guardrail == null
}

test_a_team_guardrail_applies_to_every_model if {
	plan := decide("careful", "plain")
	plan.allow
	plan.guardrail == strict
}

test_a_model_guardrail_applies_to_every_team if {
	plan := decide("open", "guarded")
	plan.allow
	plan.guardrail == {"identifier": "gr0strict", "version": "3"}
}

test_the_same_guardrail_from_both_applies_once if {
	plan := decide("careful", "guarded")
	plan.allow
	plan.guardrail == strict
}

test_different_guardrails_from_team_and_model_are_a_conflict if {
	plan := decide("careful", "lenient")
	not plan.allow
	plan.reasons[0].code == "guardrail_conflict"
	plan.guardrail == null
	plan.targets == []
}

test_a_model_whose_guardrail_conflicts_with_the_team_is_not_listed if {
	listed := data.portcullis.visible_models with input as {"principal": {"team": "careful", "user": null}}
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
	listed == ["guarded", "guarded-then-lenient", "plain", "plain-then-lenient"]
}

test_a_fallback_requiring_another_guardrail_is_never_a_target if {
	plan := decide("open", "guarded-then-lenient")
	plan.guardrail == strict
	[t.canonical_model | some t in plan.targets] == ["guarded-then-lenient", "plain"]
	[r.reasons | some r in plan.rejected_targets; r.canonical_model == "lenient"] == [["guardrail_conflict"]]
}

test_a_fallback_requiring_a_guardrail_the_request_lacks_is_never_a_target if {
	plan := decide("open", "plain-then-lenient")
	plan.guardrail == null
	[t.canonical_model | some t in plan.targets] == ["plain-then-lenient"]
	plan.rejected_targets[0].reasons == ["guardrail_conflict"]
}

test_unknown_names_carry_no_guardrail if {
	decide("nobody", "plain").guardrail == null
	decide("careful", "nothing-by-this-name").guardrail == null
}

test_the_index_gives_the_same_decisions if {
	index := data.portcullis.compiled_index with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
	every team in ["open", "careful"] {
		every model in ["plain", "guarded", "lenient", "guarded-then-lenient", "plain-then-lenient"] {
			indexed := decide(team, model) with data.portcullis.compiled as index # its own expression: a `with` covers both sides of an `==`
			computed := decide(team, model)
			indexed == computed
		}
	}
}
