# Budgets and rate limits the plan carries (docs/budgets.md, "Rules").
package portcullis.limits_test

limits(team, user) := plan.limits if {
	request := {
		"principal": {"team": team, "user": user, "key_id": "key_test"},
		"request": {"protocol": "anthropic_messages", "model": "haiku", "stream": false, "max_tokens": 100, "requires": [], "tools": []},
	}
	plan := data.portcullis.decision with input as request
}

counter(l, scope, metric, period) := c if {
	some c in l.counters
	c.scope == scope
	c.metric == metric
	c.period == period
}

test_each_support_agent_has_a_rate_of_their_own if {
	l := limits("support", "sam")
	l.effective.requests_per_minute == 30
	counter(l, "user:support/sam", "requests", "minute").block == 30
	counter(limits("support", "kim"), "user:support/kim", "requests", "minute").block == 30
}

test_platform_spend_is_capped_per_month if {
	c := counter(limits("platform", "alice"), "team:platform", "cost", "month")
	c.block == "2000.00"
}
