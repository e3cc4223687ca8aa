# The helpers the packages share: `portcullis policy test policies policy-tests`.
package portcullis.lib_test

test_a_policy_covers_the_teams_it_names_or_every_team_with_a_star if {
	data.portcullis.lib.covers(["payments", "hr"], "hr")
	data.portcullis.lib.covers(["*"], "anyone")
	not data.portcullis.lib.covers(["payments"], "hr")
	not data.portcullis.lib.covers([], "hr")
}

seoul := {"region": "ap-northeast-2"}

# an `apac.` inference profile homed in Seoul that may route to three regions
apac_profile := {"region": "ap-northeast-2", "regions": ["ap-northeast-2", "ap-northeast-1", "ap-southeast-1"]}

test_a_null_region_lock_locks_nothing if {
	data.portcullis.lib.target_within(null, seoul)
	data.portcullis.lib.target_within(null, apac_profile)
}

test_a_target_without_regions_is_within_a_lock_on_its_region if {
	data.portcullis.lib.target_within({"ap-northeast-2": true}, seoul)
	not data.portcullis.lib.target_within({"us-east-1": true}, seoul)
	not data.portcullis.lib.target_within({}, seoul)
}

test_a_region_set_wholly_inside_the_lock_is_within_it if {
	data.portcullis.lib.target_within({"ap-northeast-2": true, "ap-northeast-1": true, "ap-southeast-1": true, "us-west-2": true}, apac_profile)
}

test_a_region_set_partly_outside_the_lock_is_not_within_it if {
	# its home region alone is not enough: the profile may route to the other two
	not data.portcullis.lib.target_within({"ap-northeast-2": true}, apac_profile)
	not data.portcullis.lib.target_within({"ap-northeast-2": true, "ap-northeast-1": true}, apac_profile)
}
