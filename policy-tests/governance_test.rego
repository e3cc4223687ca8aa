# Governance rules merge most-restrictively: `portcullis policy test policies policy-tests`.
package portcullis.governance_test


tenants := {"teams": {"payments": {"models": ["*"], "users": {"alice": {}}}, "research": {"models": ["*"]}}}

catalog := {
	"aliases": {},
	"models": {"m": {"targets": [{
		"provider": "p", "model": "m-1", "region": "r", "priority": 1,
		"context_window": 1000, "max_output_tokens": 100, "capabilities": [],
	}]}},
	"prices": [],
}

rules := {
	"team-rate": {"subject": {"team": "payments"}, "rate": {"rpm": 600, "tpm": 200000}},
	"alice-rate": {"subject": {"team": "payments", "user": "alice"}, "rate": {"rpm": 100}},
	"team-month": {"subject": {"team": "payments"}, "budget": {"limit_usd": "1000", "period": "CalendarMonth"}},
	"team-month-tighter": {"subject": {"team": "payments"}, "budget": {"limit_usd": "750.50", "period": "CalendarMonth"}},
	"team-day-warn": {"subject": {"team": "payments"}, "budget": {"limit_usd": "80", "period": "CalendarDay"}, "failure_policy": "Warn"},
	"team-day-soft": {"subject": {"team": "payments"}, "budget": {"limit_usd": "100", "period": "CalendarDay", "hard_cap": false}},
	"research-unlimited": {"subject": {"team": "research"}, "unlimited": true},
	"research-quota": {"subject": {"team": "research", "per": "user"}, "quota": {"tokens_per_day": 1000}},
	"org-warn": {"subject": {}, "rate": {"rpm": 1000}, "failure_policy": "Warn"},
	"org-block": {"subject": {}, "rate": {"rpm": 1000}},
	"one-key": {"subject": {"key": "key_00000000000000aa"}, "rate": {"rpm": 5}},
}

limits(team, user, key) := limits_under(rules, team, user, key)

limits_under(governance, team, user, key) := plan.limits if {
	request := {"principal": {"team": team, "user": user, "key_id": key}, "request": {"model": "m", "requires": []}}
	plan := data.portcullis.decision with input as request
		with data.portcullis.tenants as tenants
		with data.portcullis.catalog as catalog
		with data.portcullis.governance.rules as governance
}

counter(l, scope, metric, period) := c if {
	some c in l.counters
	c.scope == scope
	c.metric == metric
	c.period == period
}

test_team_and_user_rates_merge_to_the_stricter if {
	l := limits("payments", "alice", "key_1")
	l.effective.requests_per_minute == 100
	counter(l, "team:payments", "requests", "minute").block == 600
	counter(l, "user:payments/alice", "requests", "minute").block == 100
}

test_other_users_keep_the_team_rate if {
	limits("payments", "bob", "key_2").effective.requests_per_minute == 600
}

test_rules_on_one_counter_keep_the_lowest_limit if {
	c := counter(limits("payments", null, "key_1"), "team:payments", "cost", "month")
	c.block == "750.50"
	c.rules == ["team-month", "team-month-tighter"]
	c.hard == true
}

test_warn_below_block_is_kept if {
	c := counter(limits("payments", null, "key_1"), "team:payments", "cost", "day")
	c.block == "100"
	c.warn == "80"
	c.hard == false # the only blocking rule on this counter is a soft cap
}

test_block_beats_warn_on_a_tie if {
	c := counter(limits("payments", null, "key_1"), "org", "requests", "minute")
	c.block == 1000
	c.warn == null
	c.rules == ["org-block", "org-warn"]
}

test_unlimited_is_listed_and_narrows_nothing if {
	l := limits("research", "carol", "key_3")
	l.unlimited == ["research-unlimited"]
	counter(l, "user:research/carol", "tokens", "day").block == 1000
}

test_unlimited_widens_nothing if {
	# the organisation-wide rate still applies to research
	counter(limits("research", null, "key_3"), "org", "requests", "minute").block == 1000
}

test_per_user_rules_count_each_user_apart if {
	counter(limits("research", "carol", "key_3"), "user:research/carol", "tokens", "day")
	counter(limits("research", "dan", "key_4"), "user:research/dan", "tokens", "day")
	counter(limits("research", null, "key_5"), "key:key_5", "tokens", "day") # no user: the key counts
}

test_key_rules_apply_to_that_key_only if {
	counter(limits("payments", null, "key_00000000000000aa"), "key:key_00000000000000aa", "requests", "minute").block == 5
	not counter(limits("payments", null, "key_1"), "key:key_00000000000000aa", "requests", "minute")
}

test_user_rules_do_not_reach_other_teams if {
	not counter(limits("research", "alice", "key_6"), "user:payments/alice", "requests", "minute")
}

test_no_rules_no_limits if {
	l := limits_under({}, "research", null, "key_7")
	l.counters == []
	l.effective == {}
}

test_refused_requests_carry_no_limits if {
	request := {"principal": {"team": "payments", "user": null, "key_id": "k"}, "request": {"model": "nope", "requires": []}}
	plan := data.portcullis.decision with input as request
		with data.portcullis.tenants as tenants
		with data.portcullis.catalog as catalog
		with data.portcullis.governance.rules as rules
	plan.limits.counters == []
}

test_a_stricter_soft_cap_does_not_harden_a_looser_hard_one if {
	soft_and_hard := {
		"soft": {"subject": {"team": "payments"}, "budget": {"limit_usd": "50", "period": "CalendarMonth", "hard_cap": false, "thresholds": [90]}},
		"hard": {"subject": {"team": "payments"}, "budget": {"limit_usd": "100", "period": "CalendarMonth", "thresholds": [50]}},
	}
	c := counter(limits_under(soft_and_hard, "payments", null, "k"), "team:payments", "cost", "month")
	c.block == "50"
	c.hard == false
	c.thresholds == [90] # the governing rule's own percentages, not the looser rule's
}
