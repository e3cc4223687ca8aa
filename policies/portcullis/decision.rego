# METADATA
# title: Portcullis entry points
# description: >-
#   The rules the gateway evaluates, and nothing else: here the ones it evaluates per
#   request, in index.rego the one it evaluates once per bundle. Each concern lives in
#   a package of its own (portcullis.access, .routing, .governance, .pii, .integrity,
#   .guardrails, and the helpers they share in portcullis.lib); this package composes
#   them.
package portcullis

# Cost model (regorus 0.13): every rule a query touches costs ~5 µs, a function call
# ~2 µs, a local statement under 1 µs. So the request path is a few functions over
# locals, and every lookup is keyed (team, user, model): a decision costs the same
# whether the bundle lists five teams or five hundred. Other packages are reached by
# full path (data.portcullis.access.resolve): `import` of a package, read through the
# import's name, makes regorus evaluate that package's whole document.

# METADATA
# title: Decision plan
# description: >-
#   The request's input document ({principal, request}) turned into a decision plan
#   (schemas/decision-plan.schema.json). The first failed check decides; the order
#   mirrors the pipeline (L1 names, then L2 entitlements).
# entrypoint: true
decision := _authorise(input.principal, input.request, model) if {
	data.portcullis.tenants.teams[input.principal.team]
	model := data.portcullis.access.resolve(input.request.model)
} else := _refuse(input.request, "unknown_team", "the key's team is not defined in the active policy bundle") if {
	not data.portcullis.tenants.teams[input.principal.team]
} else := _refuse(input.request, "unknown_model", "the requested model is not served by this gateway")

# METADATA
# title: Visible models
# description: >-
#   Canonical IDs a principal may call, for GET /v1/models: a model is listed when at
#   least one of its own targets passes the same entitlements a request would, and its
#   guardrail does not conflict with the team's.
# entrypoint: true
visible_models := sort({model |
	granted := data.portcullis.access.entitlements(input.principal)
	some model, _ in granted.models
	some target in data.portcullis.catalog.models[model].targets
	data.portcullis.lib.target_within(granted.regions, target)
	not data.portcullis.guardrails.required(input.principal.team, model).conflict
})

# METADATA
# title: Injection scan
# description: >-
#   Each of input.texts' matched injection rules and their summed weight (layer C);
#   the reference the gateway's RE2 fast path is checked against.
# entrypoint: true
injection_scan := [data.portcullis.integrity.scan(text) | some text in input.texts]

# METADATA
# title: Tool-call verdicts
# description: >-
#   Whether the team may receive each of the model's tool calls (layer D); input is
#   {principal, calls: [{name, arguments}], declared: [names the request offered]}.
# entrypoint: true
tool_call_verdicts := [data.portcullis.integrity.verdict(input.principal, call) | some call in input.calls]

# The one place a plan's shape is written: every plan, allowed or refused, is built
# here. A plan allows exactly when its first reason is "allowed".
_plan(request, model, reasons, targets, rejected_targets, limits, pii, integrity, guardrail) := {
	"allow": reasons[0].code == "allowed",
	"reasons": reasons,
	"requested_model": request.model,
	"model": model,
	"targets": targets,
	"rejected_targets": rejected_targets,
	"limits": limits,
	"pii": pii,
	"integrity": integrity,
	"guardrail": guardrail,
}

_refuse(request, code, message) := _plan(request, null, [{"code": code, "message": message}], [], [], _no_limits, null, null, null)

_no_limits := {"counters": [], "unlimited": [], "effective": {}}

# Every candidate (the model's own targets, then its fallbacks') is re-authorised
# against the same entitlements as the requested model (seed §4.8).
_authorise(principal, request, model) := plan if {
	granted := data.portcullis.access.entitlements(principal)
	requires := object.get(request, "requires", [])
	guardrails := data.portcullis.guardrails.required(principal.team, model)
	candidates := data.portcullis.routing.candidates(model)
	authorised := [i |
		some i, candidate in candidates
		granted.models[candidate.canonical_model]
		data.portcullis.lib.target_within(granted.regions, candidate)
		not guardrails.unserved[candidate.canonical_model]
		every needed in requires {
			needed in object.get(candidate, "capabilities", [])
		}
	]
	targets := [candidates[i] | some i in authorised]
	integrity := data.portcullis.integrity.for_principal(principal)
	refused_tools := data.portcullis.integrity.tools_refused(integrity, object.get(request, "tools", []))
	plan := _plan(
		request,
		model,
		_authorisation(object.get(granted.models, model, false), guardrails.conflict, targets, refused_tools),
		targets,
		[object.union(candidate, {"reasons": _rejections(granted, requires, guardrails.unserved, candidate)}) |
			some i, candidate in candidates
			not i in authorised
		],
		data.portcullis.governance.limits(principal),
		data.portcullis.pii.for_principal(principal),
		integrity,
		guardrails.guardrail,
	)
}

# Why a candidate was refused, for the plan and the audit record.
_rejections(granted, requires, unserved, candidate) := array.concat(
	array.concat(
		["model_not_allowed" | not granted.models[candidate.canonical_model]],
		["region_not_allowed" | not data.portcullis.lib.target_within(granted.regions, candidate)],
	),
	array.concat(
		["guardrail_conflict" | unserved[candidate.canonical_model]],
		# object.get: `not x in <undefined>` is true in regorus but undefined in OPA
		["capability_unsupported" | some needed in requires; not needed in object.get(candidate, "capabilities", [])],
	),
)

_authorisation(model_granted, guardrail_conflict, targets, refused_tools) := [{"code": "model_not_allowed", "message": "the requested model is not allowed for this key"}] if {
	not model_granted
} else := [{"code": "guardrail_conflict", "message": "this team and the requested model require different Bedrock guardrails; the policy bundle must settle on one"}] if {
	guardrail_conflict
} else := [{"code": "no_authorised_target", "message": "no target of the requested model is allowed for this key and request"}] if {
	targets == []
} else := [{"code": "tool_not_allowed", "message": "the request offers tools this team's policy does not allow", "tools": refused_tools}] if {
	count(refused_tools) > 0
} else := [{"code": "allowed", "message": "request authorised"}]
