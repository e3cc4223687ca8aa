# The gateway's load-time entry point (decision.rego holds the per-request ones).
package portcullis

# METADATA
# title: Per-bundle index
# description: >-
#   Input-free precomputation, evaluated once when the gateway loads a bundle and
#   stored at data.portcullis.compiled, so request-time checks are lookups instead of
#   glob matches and sorts. Each concern contributes its part and computes the same
#   values itself when the index is absent.
# entrypoint: true
compiled_index := object.union(data.portcullis.governance.index, {
	"principals": data.portcullis.access.index,
	"candidates": data.portcullis.routing.index,
	"pii": data.portcullis.pii.index,
	"integrity": data.portcullis.integrity.index,
	"guardrails": data.portcullis.guardrails.index,
	"context_fit": data.portcullis.context_fit.index,
})
