# The candidate chain of a model: its own targets by priority, then each declared
# fallback model's, each tagged with the canonical model it serves. Input-free, so
# the gateway precompiles it per bundle (data.portcullis.compiled_index).
package portcullis.routing

# A model's ordered candidates, from the per-bundle index when there is one.
candidates(model) := found if {
	found := data.portcullis.compiled.candidates[model]
} else := _candidates_of(model)

# This package's part of the per-bundle index: every model's candidates.
index := {model: _candidates_of(model) | some model, _ in data.portcullis.catalog.models}

_chain_of(model) := array.concat([model], object.get(data.portcullis.catalog.models[model], "fallbacks", []))

_candidates_of(model) := [candidate |
	some member in _chain_of(model)
	targets := data.portcullis.catalog.models[member].targets
	some pair in sort([[t.priority, i] | some i, t in targets])
	candidate := object.union(targets[pair[1]], {"canonical_model": member})
]
