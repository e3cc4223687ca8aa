# The candidate chain of a model: its own targets by priority, then each declared
# fallback model's, each tagged with the canonical model it serves. Input-free, so
# the gateway precompiles it per bundle (compiled_index).
package portcullis

chain_of(model) := array.concat([model], object.get(data.portcullis.catalog.models[model], "fallbacks", []))

candidates_of(model) := [candidate |
	some member in chain_of(model)
	targets := data.portcullis.catalog.models[member].targets
	some pair in sort([[t.priority, i] | some i, t in targets])
	candidate := object.union(targets[pair[1]], {"canonical_model": member})
]

candidates_for(model) := found if {
	found := data.portcullis.compiled.candidates[model]
} else := candidates_of(model)
