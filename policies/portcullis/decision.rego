# Entry point of the gateway: data.portcullis.decision turns the request's input
# document into a decision plan (schemas/decision-plan.schema.json).
#
# Cost model (regorus 0.13): every rule a query touches costs ~5 µs, a function call
# ~2 µs, a local statement under 1 µs. So the request path is a few functions over
# locals, and every lookup is keyed (team, user, model): a decision costs the same
# whether the bundle lists five teams or five hundred.
package portcullis

# The first failed check decides; the order mirrors the pipeline (L1, then L2).
decision := authorise(input.principal, input.request, model) if {
	data.portcullis.tenants.teams[input.principal.team]
	model := resolve(input.request.model)
} else := refuse(input.request, "unknown_team", "the key's team is not defined in the active policy bundle") if {
	not data.portcullis.tenants.teams[input.principal.team]
} else := refuse(input.request, "unknown_model", "the requested model is not served by this gateway")

refuse(request, code, message) := {
	"allow": false,
	"reasons": [{"code": code, "message": message}],
	"requested_model": request.model,
	"model": null,
	"targets": [],
	"rejected_targets": [],
	"limits": {"counters": [], "unlimited": [], "effective": {}},
	"pii": null,
	"integrity": null,
}

# Every candidate (the model's own targets, then its fallbacks') is re-authorised
# against the same entitlements as the requested model (seed §4.8).
authorise(principal, request, model) := plan if {
	granted := entitlements_for(principal)
	requires := object.get(request, "requires", [])
	candidates := candidates_for(model)
	authorised := [i |
		some i, candidate in candidates
		granted.models[candidate.canonical_model]
		region_within(granted.regions, candidate.region)
		every needed in requires {
			needed in object.get(candidate, "capabilities", [])
		}
	]
	targets := [candidates[i] | some i in authorised]
	integrity := integrity_for(principal)
	reasons := authorisation(object.get(granted.models, model, false), targets, tools_refused(integrity, object.get(request, "tools", [])))
	plan := {
		"allow": reasons[0].code == "allowed",
		"reasons": reasons,
		"requested_model": request.model,
		"model": model,
		"targets": targets,
		"rejected_targets": [object.union(candidate, {"reasons": rejections(granted, requires, candidate)}) |
			some i, candidate in candidates
			not i in authorised
		],
		"limits": limits_for(principal),
		"pii": pii_for(principal),
		"integrity": integrity,
	}
}

# Why a candidate was refused, for the plan and the audit record.
rejections(granted, requires, candidate) := array.concat(
	array.concat(
		["model_not_allowed" | not granted.models[candidate.canonical_model]],
		["region_not_allowed" | not region_within(granted.regions, candidate.region)],
	),
	# object.get: `not x in <undefined>` is true in regorus but undefined in OPA
	["capability_unsupported" | some needed in requires; not needed in object.get(candidate, "capabilities", [])],
)

authorisation(model_granted, targets, refused_tools) := [{"code": "model_not_allowed", "message": "the requested model is not allowed for this key"}] if {
	not model_granted
} else := [{"code": "no_authorised_target", "message": "no target of the requested model is allowed for this key and request"}] if {
	targets == []
} else := [{"code": "tool_not_allowed", "message": "the request offers tools this team's policy does not allow", "tools": refused_tools}] if {
	count(refused_tools) > 0
} else := [{"code": "allowed", "message": "request authorised"}]

# Canonical IDs a principal may call, for GET /v1/models: a model is listed when at
# least one of its own targets passes the same entitlements a request would.
visible_models := sort({model |
	granted := entitlements_for(input.principal)
	some model, _ in granted.models
	some target in data.portcullis.catalog.models[model].targets
	region_within(granted.regions, target.region)
})
