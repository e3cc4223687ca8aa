# The quickstart bundle's own data (no mocks): the names coding agents send by default
# resolve to a served model the demo team may use. `portcullis policy test`.
package portcullis.catalog_test

agent_defaults := [
	"claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", # Claude Code 2.1.332: default, sonnet, haiku
	"claude-opus-4-8", "claude-sonnet-5", "claude-haiku-4-5-20251001", # Claude Code 2.1.197
	"claude-opus-4-8[1m]", "claude-sonnet-5[1m]", # the 1M-context variants
	"claude-sonnet-4-6", # opencode 1.18's default (its title call: claude-haiku-4-5-20251001)
]

decide(user, model) := plan if {
	request := {
		"principal": {"team": "demo", "user": user, "key_id": "k"},
		"request": {"model": model, "requires": [], "protocol": "anthropic_messages", "stream": true},
	}
	plan := data.portcullis.decision with input as request
}

test_agent_defaults_are_served_to_the_demo_team if {
	every model in agent_defaults {
		decide("alice", model).allow
	}
}

test_context_variant_is_its_model if {
	plan := decide("alice", "claude-opus-4-8[1m]")
	plan.model == "claude-opus-4-8"
	plan.requested_model == "claude-opus-4-8[1m]"
	plan.targets[0].model == "claude-opus-4-8"
}

test_bob_still_gets_only_gpt_4o_mini if {
	decide("bob", "claude-opus-4-8").reasons[0].code == "model_not_allowed"
	decide("bob", "mini").allow
}
