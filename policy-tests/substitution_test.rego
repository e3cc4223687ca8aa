# The routing layers' one substitution mechanism (decision.rego): a layer's proposed
# model replaces the model so far only when the principal may use it and it keeps an
# authorised target; otherwise the model so far stays and the refusal is recorded.
package portcullis_substitution_test

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
		"claude-opus-4-8": {"targets": [target("anthropic", "claude-opus-4-8", "us-east-1")]},
	},
	"prices": [],
}

tenants := {"teams": {"payments": {"models": ["claude-sonnet-*", "claude-haiku-*", "glm-*"], "regions": ["us-east-1"]}}}

substitute(proposal) := substitute_for("claude-sonnet-4-5", proposal, {})

substitute_for(model, proposal, facts) := result if {
	granted := data.portcullis.access.entitlements({"team": "payments", "user": null})
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
	current := data.portcullis._serve("payments", granted, [], model)
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
	result := data.portcullis._substitute(granted, [], "payments", current, "budget_tier", proposal, facts)
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
}

test_a_granted_substitute_with_a_target_replaces_the_model if {
	result := substitute({"model": "claude-haiku-4-5", "tier": "red"})
	result.route.model == "claude-haiku-4-5"
	[t.model | some t in result.route.targets] == ["claude-haiku-4-5-20251001"]
	result.layers == [{"layer": "budget_tier", "from": "claude-sonnet-4-5", "to": "claude-haiku-4-5", "model": "claude-haiku-4-5", "tier": "red", "applied": true}]
}

test_a_substitute_the_team_may_not_use_keeps_the_model if {
	result := substitute({"model": "claude-opus-4-8", "tier": "upgrade"})
	result.route.model == "claude-sonnet-4-5"
	result.layers[0].applied == false
	result.layers[0].reasons == ["model_not_allowed"]
}

test_a_substitute_outside_the_region_lock_keeps_the_model if {
	result := substitute({"model": "glm-4.6", "tier": "yellow"})
	result.route.model == "claude-sonnet-4-5"
	result.layers[0].reasons == ["no_authorised_target"]
}

test_no_proposal_changes_nothing if {
	result := substitute(null)
	result.route.model == "claude-sonnet-4-5"
	result.layers == []
}

test_proposing_the_model_itself_keeps_it_and_records_the_tier if {
	result := substitute({"model": "claude-sonnet-4-5", "tier": "green"})
	result.route.model == "claude-sonnet-4-5"
	result.layers == [{"layer": "budget_tier", "from": "claude-sonnet-4-5", "to": "claude-sonnet-4-5", "model": "claude-sonnet-4-5", "tier": "green", "applied": true}]
}

test_routing_names_the_resolved_model_and_the_last_layer_taken if {
	layers := [
		{"layer": "intent", "from": "a", "to": "b", "applied": true},
		{"layer": "budget_tier", "from": "b", "to": "c", "applied": false, "reasons": ["model_not_allowed"]},
	]
	data.portcullis._routing("a", "b", layers) == {"layers": layers, "substituted_from": "a", "layer": "intent"}
	data.portcullis._routing("a", "a", []) == {"layers": [], "substituted_from": null, "layer": null}
}

test_a_layer_that_kept_the_model_is_not_named_as_the_substituting_one if {
	layers := [
		{"layer": "intent", "from": "a", "to": "b", "applied": true},
		{"layer": "budget_tier", "from": "b", "to": "b", "applied": true},
	]
	data.portcullis._routing("a", "b", layers).layer == "intent"
}

test_a_request_its_own_model_cannot_serve_is_not_rescued_by_a_substitute if {
	# glm-4.6 is granted but only outside the region lock: refused at L2, never routed
	result := substitute_for("glm-4.6", {"model": "claude-haiku-4-5", "tier": "red"}, {})
	result.route.model == "glm-4.6"
	result.route.targets == []
	result.layers == []
}

test_a_substitute_that_cannot_hold_the_conversation_keeps_the_model if {
	result := substitute_for("claude-sonnet-4-5", {"model": "claude-haiku-4-5", "tier": "light"}, {"features": {"input_tokens": 262144}})
	result.route.model == "claude-sonnet-4-5"
	result.layers[0].reasons == ["context_exceeded"]
	fits := substitute_for("claude-sonnet-4-5", {"model": "claude-haiku-4-5", "tier": "light"}, {"features": {"input_tokens": 65536}})
	fits.route.model == "claude-haiku-4-5"
}
