# What the routing layers do with the starter catalog: circuit breakers (L6) and
# context fit (L5). docs/policies.md, "Circuit breakers (L6)" and "Context fit".
package portcullis.routing_test

# The breaker the gateway names "provider/model@region" is open (input.facts.breakers).
decide_with_bedrock_down(team) := plan if {
	request := {
		"principal": {"team": team, "user": null, "key_id": "key_test"},
		"request": {"protocol": "anthropic_messages", "model": "haiku", "stream": false, "max_tokens": 100, "requires": [], "tools": []},
		"facts": {"breakers": {"bedrock/anthropic.claude-haiku-4-5-20251001-v1:0@eu-central-1": {"state": "open", "until": 1796083200}}},
	}
	plan := data.portcullis.decision with input as request
}

test_an_open_breaker_moves_platform_to_the_next_target if {
	plan := decide_with_bedrock_down("platform")
	plan.allow
	[t.provider | some t in plan.targets] == ["anthropic"]
}

test_an_open_breaker_never_takes_support_out_of_the_eu if {
	plan := decide_with_bedrock_down("support")
	not plan.allow
	plan.reasons[0].code == "targets_unavailable"
	plan.targets == []
}

# The gateway counts each target's input and asks which windows hold it.
test_a_prompt_too_large_for_a_window_does_not_fit if {
	mini := {"index": 0, "context_window": 128000, "max_output_tokens": 16384, "input_tokens": 127500, "method": "exact"}
	sonnet := {"index": 1, "context_window": 200000, "max_output_tokens": 64000, "input_tokens": 127500, "method": "upper_bound"}
	verdicts := data.portcullis.context_fit_verdicts with input as {"targets": [mini, sonnet], "output_tokens": 1000, "reasoning_tokens": null, "reasoning_effort": null}
	[v.fits | some v in verdicts] == [false, true]
	verdicts[0].reasons == ["context_exceeded"]
}
