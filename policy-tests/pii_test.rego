# PII policies merge most-restrictively: `portcullis policy test policies policy-tests`.
package portcullis.pii_test

tenants := {"teams": {"payments": {"models": ["*"]}, "hr": {"models": ["*"]}, "research": {"models": ["*"]}}}

catalog := {
	"aliases": {},
	"models": {"m": {"targets": [{
		"provider": "p", "model": "m-1", "region": "r", "priority": 1,
		"context_window": 1000, "max_output_tokens": 100, "capabilities": [],
	}]}},
	"prices": [],
}

policies := {
	"regulated": {
		"teams": ["payments", "hr"],
		"actions": {"EMAIL": "pseudonymize", "CREDIT_CARD": "mask", "KR_RRN": "block", "IBAN": "tokenize"},
		"scope": {"supported_egress_fields": ["text", "tool_arguments", "tool_results"], "unsupported_sensitive_content": "internal"},
		"on_error": "fail_open",
		"token_readers": ["payments/alice", "hr/*"],
	},
	"cards-strict": {
		"teams": ["payments"],
		"actions": {"CREDIT_CARD": "redact", "EMAIL": "mask", "PERSON": "pseudonymize"},
		"detectors": ["ner"],
		"min_score": 0.4,
		"scope": {"supported_egress_fields": ["text", "tool_descriptions"]},
	},
	"everyone-secrets": {"teams": ["*"], "actions": {"SECRET": "block"}},
}

pii(team, user) := plan.pii if {
	request := {"principal": {"team": team, "user": user, "key_id": "key_1"}, "request": {"model": "m", "requires": []}}
	plan := data.portcullis.decision with input as request
		with data.portcullis.tenants as tenants
		with data.portcullis.catalog as catalog
		with data.portcullis.pii.policies as policies
}

test_each_entity_takes_the_strictest_action if {
	p := pii("payments", "bob")
	p.policies == ["cards-strict", "everyone-secrets", "regulated"]
	p.actions == {"EMAIL": "pseudonymize", "CREDIT_CARD": "redact", "KR_RRN": "block", "IBAN": "tokenize", "PERSON": "pseudonymize", "SECRET": "block"}
}

test_detectors_add_up_and_the_lowest_score_threshold_wins if {
	p := pii("payments", "bob")
	p.detectors == ["ner", "patterns"]
	p.min_score == 0.4
}

test_only_fields_every_policy_supports_are_supported if {
	pii("payments", "bob").fields == ["text"]
	pii("hr", "bob").fields == ["text", "tool_arguments", "tool_results"]
}

test_block_beats_internal_routing_and_fail_closed_beats_fail_open if {
	p := pii("payments", "bob")
	p.unsupported == "block" # cards-strict and everyone-secrets default to block
	p.on_error == "fail_closed"
}

test_a_policy_left_at_its_defaults_is_strict_and_counts_in_the_merge if {
	p := pii("hr", null)
	p.policies == ["everyone-secrets", "regulated"]
	p.unsupported == "block" # everyone-secrets' default
	p.on_error == "fail_closed"
}

test_tokens_are_restored_only_for_readers_of_every_tokenizing_policy if {
	pii("payments", "alice").restore_tokens == true
	pii("payments", "bob").restore_tokens == false
	pii("payments", null).restore_tokens == false
	pii("hr", "anyone").restore_tokens == true
}

test_a_wildcard_policy_covers_every_team if {
	pii("research", null).actions == {"SECRET": "block"}
}

test_no_policy_no_pii_section if {
	request := {"principal": {"team": "research", "user": null, "key_id": "key_1"}, "request": {"model": "m", "requires": []}}
	plan := data.portcullis.decision with input as request
		with data.portcullis.tenants as tenants
		with data.portcullis.catalog as catalog
		with data.portcullis.pii.policies as {}
	plan.pii == null
}

classifier_catalog := object.union(catalog, {"models": {
	"m": catalog.models.m,
	"classifier": {"targets": [
		{"provider": "p", "model": "c-us", "region": "us", "priority": 1, "context_window": 1000, "max_output_tokens": 100, "internal": true},
		{"provider": "p", "model": "c-public", "region": "eu", "priority": 2, "context_window": 1000, "max_output_tokens": 100},
		{"provider": "p", "model": "c-eu", "region": "eu", "priority": 3, "context_window": 1000, "max_output_tokens": 100, "internal": true},
	]},
}})

classifier_plan(team) := classifier_plan_in(team, classifier_catalog)

classifier_plan_in(team, served) := plan.pii.classifier if {
	request := {"principal": {"team": team, "user": null, "key_id": "key_1"}, "request": {"model": "m", "requires": []}}
	plan := data.portcullis.decision with input as request
		with data.portcullis.tenants as {"teams": {"payments": {"models": ["*"]}, "eu-bank": {"models": ["*"], "regions": ["eu"]}}}
		with data.portcullis.catalog as served
		with data.portcullis.pii.classifier as {"model": "classifier"}
		with data.portcullis.pii.policies as {"ctx": {"teams": ["payments", "eu-bank"], "actions": {"PERSON": "pseudonymize"}, "detectors": ["classifier"]}}
}

test_the_classifier_runs_on_an_internal_target_within_the_principals_regions if {
	classifier_plan("payments").target.model == "c-us"
	classifier_plan("eu-bank").target.model == "c-eu" # never c-us, never the public c-public
	classifier_plan("payments").max_output_tokens == 512
}

test_the_classifier_skips_an_internal_target_that_may_route_outside_the_principals_regions if {
	# c-eu-profile is homed in eu but may route to us: an eu-locked team never gets it
	profile_catalog := object.union(classifier_catalog, {"models": {"classifier": {"targets": [
		{"provider": "p", "model": "c-eu-profile", "region": "eu", "regions": ["eu", "us"], "priority": 1, "context_window": 1000, "max_output_tokens": 100, "internal": true},
		{"provider": "p", "model": "c-eu", "region": "eu", "priority": 2, "context_window": 1000, "max_output_tokens": 100, "internal": true},
	]}}})
	classifier_plan_in("eu-bank", profile_catalog).target.model == "c-eu"
	classifier_plan_in("payments", profile_catalog).target.model == "c-eu-profile"
}
