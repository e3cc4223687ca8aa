# Unit tests of the default bundle's decision rules: `portcullis policy test policies policy-tests`.
# They mock tenants and catalog with `with`, so they hold whatever data a deployment ships.
package portcullis_test


target(provider, model, region, priority, capabilities) := {
	"provider": provider, "model": model, "region": region, "priority": priority,
	"context_window": 200000, "max_output_tokens": 8192, "capabilities": capabilities,
}

catalog := {
	"aliases": {"sonnet": "claude-sonnet-4-5", "haiku": "claude-haiku-4-5"},
	"models": {
		"claude-sonnet-4-5": {
			# deliberately listed out of priority order
			"targets": [
				target("bedrock-eu", "anthropic.claude-sonnet-4-5-v1:0", "eu-central-1", 2, ["streaming", "tools"]),
				target("anthropic", "claude-sonnet-4-5-20250929", "us-east-1", 1, ["streaming", "tools", "vision"]),
			],
			"fallbacks": ["claude-haiku-4-5"],
		},
		"claude-haiku-4-5": {"targets": [target("anthropic", "claude-haiku-4-5-20251001", "us-east-1", 1, ["streaming"])]},
		"glm-4.6": {"targets": [target("vllm", "zai-org/GLM-4.6", "ap-northeast-2", 1, ["streaming", "tools"])]},
	},
	"prices": [],
}

tenants := {"teams": {
	"payments": {
		"models": ["claude-sonnet-*", "glm-*"],
		"regions": ["us-east-1", "ap-northeast-2"],
		"users": {"alice": {"models": ["glm-*"]}, "bob": {"regions": ["ap-northeast-2"]}},
	},
	"research": {"models": ["*"]},
}}

decide(team, user, model, requires) := plan if {
	request := {
		"principal": {"team": team, "user": user, "key_id": "k"},
		"request": {"model": model, "requires": requires, "protocol": "anthropic_messages", "stream": false},
	}
	plan := data.portcullis.decision with input as request with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
}

visible(team, user) := models if {
	models := data.portcullis.visible_models with input as {"principal": {"team": team, "user": user}}
		with data.portcullis.catalog as catalog
		with data.portcullis.tenants as tenants
}

regions(plan) := [t.region | some t in plan.targets]

# --- L1: names -------------------------------------------------------------------------

test_alias_resolves_to_canonical_before_rbac if {
	plan := decide("research", null, "sonnet", [])
	plan.allow
	plan.model == "claude-sonnet-4-5"
	plan.requested_model == "sonnet"
}

test_unknown_model_is_refused if {
	plan := decide("research", null, "claude-imaginary", [])
	not plan.allow
	plan.reasons[0].code == "unknown_model"
	plan.model == null
	plan.targets == []
}

test_unknown_team_is_refused if {
	plan := decide("nobody", null, "sonnet", [])
	plan.reasons[0].code == "unknown_team"
}

# --- L2: grants and region lock ------------------------------------------------------------

test_alias_of_a_model_outside_the_grants_is_refused if {
	plan := decide("payments", null, "haiku", [])
	plan.reasons[0].code == "model_not_allowed"
}

test_glob_spans_dots if {
	decide("payments", null, "glm-4.6", []).allow
}

test_targets_are_ordered_by_priority if {
	regions(decide("research", null, "sonnet", [])) == ["us-east-1", "eu-central-1", "us-east-1"]
}

test_region_lock_drops_targets_outside_the_team_regions if {
	plan := decide("payments", null, "claude-sonnet-4-5", [])
	regions(plan) == ["us-east-1"]
	some rejected in plan.rejected_targets
	rejected.region == "eu-central-1"
	rejected.reasons == ["region_not_allowed"]
}

test_user_narrows_models if {
	decide("payments", "alice", "glm-4.6", []).allow
	decide("payments", "alice", "sonnet", []).reasons[0].code == "model_not_allowed"
}

test_user_narrows_regions if {
	plan := decide("payments", "bob", "sonnet", [])
	plan.reasons[0].code == "no_authorised_target"
	decide("payments", "bob", "glm-4.6", []).allow
}

test_unlisted_user_has_the_team_entitlements if {
	decide("payments", "carol", "sonnet", []).allow
}

# --- fallbacks are re-authorised (seed §4.8) -------------------------------------------------

test_fallback_model_outside_the_grants_is_never_a_target if {
	plan := decide("payments", null, "sonnet", [])
	every t in plan.targets {
		t.canonical_model == "claude-sonnet-4-5"
	}
	some rejected in plan.rejected_targets
	rejected.canonical_model == "claude-haiku-4-5"
	rejected.reasons == ["model_not_allowed"]
}

test_allowed_fallback_follows_the_model_own_targets if {
	plan := decide("research", null, "sonnet", [])
	[t.canonical_model | some t in plan.targets] == ["claude-sonnet-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"]
}

# --- what the request needs ------------------------------------------------------------------

test_targets_lacking_a_needed_capability_are_dropped if {
	plan := decide("research", null, "sonnet", ["vision"])
	[t.provider | some t in plan.targets] == ["anthropic"]
	count(plan.rejected_targets) == 2
}

test_no_capable_target_is_a_refusal if {
	plan := decide("research", null, "haiku", ["tools"])
	plan.reasons[0].code == "no_authorised_target"
	plan.rejected_targets[0].reasons == ["capability_unsupported"]
}

# --- listing and the per-bundle index -----------------------------------------------------------

test_visible_models_follow_grants_and_regions if {
	visible("payments", null) == ["claude-sonnet-4-5", "glm-4.6"]
	visible("payments", "bob") == ["glm-4.6"]
	visible("nobody", null) == []
}

test_index_gives_the_same_decisions if {
	index := data.portcullis.compiled_index with data.portcullis.catalog as catalog with data.portcullis.tenants as tenants
	every team in ["payments", "research"] {
		every user in [null, "alice", "bob"] {
			every model in ["sonnet", "haiku", "glm-4.6", "nope"] {
				indexed := decide(team, user, model, ["streaming"]) with data.portcullis.compiled as index
				decide(team, user, model, ["streaming"]) == indexed
			}
		}
	}
}
