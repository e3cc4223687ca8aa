# What happens to personal data, per team (docs/pii.md, "Policies").
package portcullis.pii_test

pii(team) := plan.pii if {
	request := {
		"principal": {"team": team, "user": null, "key_id": "key_test"},
		"request": {"protocol": "anthropic_messages", "model": "haiku", "stream": false, "max_tokens": 100, "requires": [], "tools": []},
	}
	plan := data.portcullis.decision with input as request
}

test_support_pseudonymizes_contacts_and_blocks_secrets if {
	p := pii("support")
	p.policies == ["everyone-secrets", "support-customer-data"]
	p.actions.EMAIL == "pseudonymize"
	p.actions.CREDIT_CARD == "mask"
	p.actions.SECRET == "block"
}

test_every_team_blocks_secrets if {
	pii("platform").actions == {"SECRET": "block"}
}
