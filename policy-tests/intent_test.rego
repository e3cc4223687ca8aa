# Routing layer L4 (intent.rego): a router covering the request proposes its tier's
# model; a tier pinned to the session wins while it is still one of the router's tiers;
# otherwise a confident classifier, then the first matching rule, then the default.
package portcullis_intent_test

router := {
	"name": "coding",
	"teams": ["payments"],
	"models": ["claude-sonnet-4-5"],
	"tiers": {"light": "claude-haiku-4-5", "standard": "claude-sonnet-4-5", "frontier": "claude-opus-4-8"},
	"default_tier": "standard",
	"rules": [
		{"tier": "frontier", "when": {"keywords_any": ["design", "security"]}},
		{"tier": "light", "when": {"keywords_any": ["mechanical"]}},
		{"tier": "light", "when": {"max_text_chars": 40, "code": false}},
	],
	"classifier": {"model": "claude-haiku-4-5", "min_confidence": 0.8},
}

everyone := object.union(router, {"name": "everyone", "teams": ["*"], "models": ["claude-sonnet-4-5", "gpt-4o-mini"], "rules": []})

# Only the routers are read by the policy (keyword sets are matched by the gateway).
# Mocked at their own path: mocking the package document would replace its rules in OPA.
routers := [router, everyone]

features(overrides) := object.union(
	{"input_tokens": 512, "tools": 0, "turns": 1, "first_turn": true, "reasoning": false, "client": "anthropic-sdk", "text_chars": 120, "code": false, "keywords": []},
	overrides,
)

payments := {"team": "payments", "user": null, "key_id": "k"}

propose(principal, model, facts) := proposal if {
	proposal := data.portcullis.intent.proposal(principal, {"model": model}, model, facts) with data.portcullis.intent.routers as routers
}

test_a_request_no_router_covers_is_not_routed if {
	propose(payments, "claude-opus-4-8", {"features": features({})}) == null
	data.portcullis.intent.proposal(payments, {}, "claude-sonnet-4-5", {"features": features({})}) == null with data.portcullis.intent.routers as []
}

test_the_first_router_covering_the_team_and_model_applies if {
	propose(payments, "claude-sonnet-4-5", {"features": features({})}).router == "coding"
	propose({"team": "research", "user": null}, "claude-sonnet-4-5", {"features": features({})}).router == "everyone"
	propose({"team": "research", "user": null}, "gpt-4o-mini", {"features": features({})}).router == "everyone"
}

test_the_first_matching_rule_chooses_the_tier if {
	both := propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["design", "mechanical"]})})
	both == {"model": "claude-opus-4-8", "tier": "frontier", "pinned": false, "by": "rule", "rule": 0, "router": "coding"}
	mechanical := propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["mechanical"]})})
	[mechanical.tier, mechanical.rule, mechanical.model] == ["light", 1, "claude-haiku-4-5"]
}

test_every_condition_of_a_rule_must_hold if {
	short := propose(payments, "claude-sonnet-4-5", {"features": features({"text_chars": 12})})
	[short.tier, short.rule] == ["light", 2]
	with_code := propose(payments, "claude-sonnet-4-5", {"features": features({"text_chars": 12, "code": true})})
	[with_code.tier, with_code.by] == ["standard", "default"]
	not with_code.rule
}

test_no_rule_matching_gives_the_default_tier if {
	propose(payments, "claude-sonnet-4-5", {"features": features({})}) == {"model": "claude-sonnet-4-5", "tier": "standard", "pinned": false, "by": "default", "router": "coding"}
}

test_a_pinned_tier_wins_over_whatever_the_turn_looks_like if {
	pinned := propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["design"], "turns": 3}), "session": {"tier": "light"}})
	pinned == {"model": "claude-haiku-4-5", "tier": "light", "pinned": true, "by": "pin", "router": "coding"}
}

test_a_pin_is_enough_when_the_features_could_not_be_measured if {
	propose(payments, "claude-sonnet-4-5", {"session": {"tier": "frontier"}}).model == "claude-opus-4-8"
}

test_without_features_or_a_pin_nothing_is_proposed if {
	propose(payments, "claude-sonnet-4-5", {}) == null
}

test_a_pin_naming_a_tier_the_router_no_longer_has_is_decided_again if {
	again := propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["security"]}), "session": {"tier": "premium"}})
	[again.tier, again.pinned, again.by] == ["frontier", false, "rule"]
}

test_a_confident_classifier_chooses_the_tier if {
	confident := propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["design"]}), "classifier": {"tier": "light", "confidence": 0.9}})
	[confident.tier, confident.by, confident.pinned] == ["light", "classifier", false]
}

test_an_unsure_failed_or_unknown_classifier_leaves_it_to_the_rules if {
	some classifier in [{"tier": "light", "confidence": 0.5}, {"error": "timeout"}, {"tier": "premium", "confidence": 0.99}]
	propose(payments, "claude-sonnet-4-5", {"features": features({"keywords": ["design"]}), "classifier": classifier}).by == "rule"
}

test_a_classifier_counts_only_for_a_router_that_declares_one if {
	plain := object.union(object.remove(everyone, ["classifier"]), {"rules": [{"tier": "standard", "when": {}}]})
	facts := {"features": features({}), "classifier": {"tier": "light", "confidence": 1}}
	proposal := data.portcullis.intent.proposal({"team": "research", "user": null}, {}, "claude-sonnet-4-5", facts) with data.portcullis.intent.routers as [plain]
	[proposal.tier, proposal.by] == ["standard", "rule"]
}

test_each_condition_reads_its_feature if {
	f := features({"input_tokens": 2048, "tools": 12, "turns": 3, "reasoning": true, "client": "claude-code", "text_chars": 300, "code": true, "keywords": ["design"]})
	holding := [
		{"keywords_any": ["design", "x"]}, {"keywords_none": ["x"]}, {"code": true}, {"reasoning": true},
		{"clients": ["codex", "claude-code"]}, {"min_input_tokens": 2048}, {"max_input_tokens": 4096}, {"min_tools": 12},
		{"max_tools": 12}, {"min_text_chars": 300}, {"max_text_chars": 300}, {"min_turns": 3}, {"max_turns": 3},
	]
	failing := [
		{"keywords_any": ["x"]}, {"keywords_none": ["design"]}, {"code": false}, {"reasoning": false},
		{"clients": ["codex"]}, {"min_input_tokens": 4096}, {"max_input_tokens": 1024}, {"min_tools": 13},
		{"max_tools": 11}, {"min_text_chars": 301}, {"max_text_chars": 299}, {"min_turns": 4}, {"max_turns": 2},
	]
	every when in holding {
		data.portcullis.intent._matches(when, f)
	}
	every when in failing {
		not data.portcullis.intent._matches(when, f)
	}
}

# --- through the decision: the proposal is re-authorised ---------------------------

target(model) := {"provider": "anthropic", "model": model, "region": "us-east-1", "priority": 1, "context_window": 200000, "max_output_tokens": 8192, "capabilities": ["streaming"]}

catalog := {
	"aliases": {"sonnet": "claude-sonnet-4-5"},
	"models": {
		"claude-sonnet-4-5": {"targets": [target("claude-sonnet-4-5-20250929")]},
		"claude-haiku-4-5": {"targets": [target("claude-haiku-4-5-20251001")]},
		"claude-opus-4-8": {"targets": [target("claude-opus-4-8")]},
	},
	"prices": [],
}

tenants := {"teams": {"payments": {"models": ["claude-sonnet-*", "claude-haiku-*"]}}}

decide(facts) := plan if {
	plan := data.portcullis.decision with input as {"principal": payments, "request": {"protocol": "anthropic_messages", "model": "sonnet", "stream": false, "requires": []}, "facts": facts}
		with data.portcullis.intent.routers as routers
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
}

test_a_light_tier_serves_its_model if {
	plan := decide({"features": features({"keywords": ["mechanical"]})})
	plan.model == "claude-haiku-4-5"
	plan.routing.substituted_from == "claude-sonnet-4-5"
	plan.routing.layer == "intent"
	plan.routing.layers[0].tier == "light"
	plan.routing.layers[0].applied == true
}

test_a_tier_model_the_team_may_not_use_keeps_the_requested_model if {
	plan := decide({"features": features({"keywords": ["design"]})})
	plan.model == "claude-sonnet-4-5"
	plan.routing.layer == null
	record := plan.routing.layers[0]
	[record.tier, record.applied, record.reasons, record.to] == ["frontier", false, ["model_not_allowed"], "claude-opus-4-8"]
}

test_a_tier_of_the_requested_model_is_recorded_so_it_can_be_pinned if {
	plan := decide({"features": features({})})
	plan.model == "claude-sonnet-4-5"
	plan.routing.substituted_from == null
	plan.routing.layers == [{"layer": "intent", "from": "claude-sonnet-4-5", "to": "claude-sonnet-4-5", "model": "claude-sonnet-4-5", "tier": "standard", "pinned": false, "by": "default", "router": "coding", "applied": true}]
}

test_a_request_without_facts_is_not_routed if {
	decide({}).routing.layers == []
}
