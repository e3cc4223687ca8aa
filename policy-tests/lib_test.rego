# The helpers the packages share: `portcullis policy test policies policy-tests`.
package portcullis.lib_test

test_a_policy_covers_the_teams_it_names_or_every_team_with_a_star if {
	data.portcullis.lib.covers(["payments", "hr"], "hr")
	data.portcullis.lib.covers(["*"], "anyone")
	not data.portcullis.lib.covers(["payments"], "hr")
	not data.portcullis.lib.covers([], "hr")
}

test_a_null_region_lock_locks_nothing if {
	data.portcullis.lib.region_within(null, "ap-northeast-2")
	data.portcullis.lib.region_within({"eu-west-1": true}, "eu-west-1")
	not data.portcullis.lib.region_within({"eu-west-1": true}, "us-east-1")
	not data.portcullis.lib.region_within({}, "us-east-1")
}
