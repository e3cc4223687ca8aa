# L4: intent / complexity tiers. A router chooses a capability tier for a request from
# the features the gateway measured (input.facts.features), the classifier's prediction
# when one ran (input.facts.classifier), and the tier already pinned to the session
# (input.facts.session); the tier names the model. decision.rego re-authorises it.
#
# Routers, keyword sets and the pin's lifetime are bundle data (data.portcullis.intent,
# schemas/bundle-data.schema.json; docs/policies.md "Intent tiers (L4)"). A session's
# tier wins while it is still one of the router's tiers, so a conversation never changes
# model mid-way; otherwise the tier is chosen now (a first turn, or a session whose pin
# expired) and the gateway pins it (pinned: false says so).
package portcullis.intent

# METADATA
# title: Intent tier proposal
# description: >-
#   {"model": the tier's model, "tier", "pinned", "router", "by": pin | classifier |
#   rule | default, "rule": the index of the rule that chose it} for a request a router
#   covers (the first whose teams and models name it), or null. Without a pin, the
#   features must be known: a request whose features could not be measured is not routed.
proposal(principal, request, model, facts) := object.union(choice, {"model": router.tiers[choice.tier], "router": router.name}) if {
	count(object.filter(facts, ["features", "session", "classifier"])) > 0 # nothing measured for this layer: no router is looked up
	covering := [i | some i in object.get(_by_model, model, []); _team_in(principal.team, data.portcullis.intent.routers[i].teams)]
	router := data.portcullis.intent.routers[covering[0]]
	choice := _choice(router, facts)
} else := null

# This package's part of the per-bundle index: for each model a router names, the
# routers that name it, in order, so a request looks its model up instead of scanning
# every router (the team is checked on those only).
index := {"by_model": {model: _naming(model) | some router in data.portcullis.intent.routers; some model in router.models}}

_naming(model) := [i | some i, router in data.portcullis.intent.routers; model in router.models]

_by_model := data.portcullis.compiled.intent.by_model if {
	data.portcullis.compiled.intent
} else := index.by_model

_team_in(team, teams) if team in teams

_team_in(_, teams) if "*" in teams

# The pin first, then a confident classifier, then the rules.
_choice(router, facts) := {"tier": tier, "pinned": true, "by": "pin"} if {
	tier := facts.session.tier
	router.tiers[tier]
} else := {"tier": tier, "pinned": false, "by": "classifier"} if {
	tier := facts.classifier.tier
	router.tiers[tier]
	facts.classifier.confidence >= router.classifier.min_confidence
} else := _ruled(router, facts.features)

_ruled(router, features) := {"tier": tier, "pinned": false, "by": "rule", "rule": first} if {
	first := [i | some i, rule in object.get(router, "rules", []); _matches(rule.when, features)][0]
	tier := router.rules[first].tier
} else := {"tier": router.default_tier, "pinned": false, "by": "default"}

_matches(when, features) if {
	every key, value in when {
		_holds(key, value, features)
	}
}

# The request's matched keyword sets are few (often none), so they are walked, not the rule's.
_holds("keywords_any", sets, features) if {
	some name in features.keywords
	name in sets
}

_holds("keywords_none", sets, features) if {
	every name in features.keywords {
		not name in sets
	}
}

_holds("code", wanted, features) if features.code == wanted

_holds("reasoning", wanted, features) if features.reasoning == wanted

_holds("clients", clients, features) if features.client in clients

_holds("min_input_tokens", bound, features) if features.input_tokens >= bound

_holds("max_input_tokens", bound, features) if features.input_tokens <= bound

_holds("min_tools", bound, features) if features.tools >= bound

_holds("max_tools", bound, features) if features.tools <= bound

_holds("min_text_chars", bound, features) if features.text_chars >= bound

_holds("max_text_chars", bound, features) if features.text_chars <= bound

_holds("min_turns", bound, features) if features.turns >= bound

_holds("max_turns", bound, features) if features.turns <= bound
