# L6: circuit breakers. The gateway counts each target's failures and tells the policy
# which breakers are not closed: input.facts.breakers maps "provider/model@region" to
# {"state": "open", "until": <epoch second it half-opens>} or {"state": "half_open"}.
# A target whose breaker is open is not authorised for the request; a half-open one
# stays, and the gateway sends it one probe. Only authorised targets are ever skipped:
# a breaker never adds a target.
package portcullis.breakers

# The gateway leaves the fact out when every breaker is closed, so the common case costs
# one lookup of the input per call (a rule would cost more: see decision.rego).

# With the fact, each candidate's breaker is looked up inline (a call per candidate
# would cost more than the lookup).

# Of the permitted candidates (indexes into candidates), those whose breaker is not open.
available(permitted, candidates) := permitted if {
	not input.facts.breakers
} else := [i |
	some i in permitted
	target := candidates[i]
	not input.facts.breakers[concat("", [target.provider, "/", target.model, "@", target.region])].state == "open"
]

# Of the permitted candidates, those whose breaker is open.
unavailable(permitted, candidates) := [] if {
	not input.facts.breakers
} else := [target |
	some i in permitted
	target := candidates[i]
	input.facts.breakers[concat("", [target.provider, "/", target.model, "@", target.region])].state == "open"
]

# A rejected candidate's breaker reason: ["breaker_open"] or [].
rejection(target) := [] if {
	not input.facts.breakers
} else := ["breaker_open"] if {
	input.facts.breakers[concat("", [target.provider, "/", target.model, "@", target.region])].state == "open"
} else := []

# The epoch second the first of these candidates' breakers half-opens.
retry_at(candidates) := min([_states[_target_id(candidate)].until | some candidate in candidates])

# The name the gateway gives a target's breaker (engine/breakers.py target_id).
_target_id(target) := concat("", [target.provider, "/", target.model, "@", target.region])

_states := object.get(object.get(input, "facts", {}), "breakers", {})
