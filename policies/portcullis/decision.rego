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
#   mirrors the pipeline (L1 names, L2 entitlements, then the routing layers that may
#   substitute the model: L4 intent tiers, L3 budget tiers). input.facts holds what the
#   gateway measured for them (features, budget utilisation, the session's pinned tier,
#   breakers); a fact that is absent means "not known", never "allowed".
# entrypoint: true
decision := _authorise(input.principal, input.request, model, object.get(input, "facts", {})) if {
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

# METADATA
# title: Context fit verdicts
# description: >-
#   Whether each authorised target holds the transformed request (routing layer L5);
#   input is {targets: [{index, context_window, max_output_tokens, input_tokens,
#   method}], output_tokens, reasoning_tokens, reasoning_effort}.
# entrypoint: true
context_fit_verdicts := data.portcullis.context_fit.verdicts(input)

# The one place a plan's shape is written: every plan, allowed or refused, is built
# here. A plan allows exactly when its first reason is "allowed".
_plan(request, model, reasons, targets, rejected_targets, limits, pii, integrity, guardrail, routing) := {
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
	"routing": routing,
}

_refuse(request, code, message) := _plan(request, null, [{"code": code, "message": message}], [], [], _no_limits, null, null, null, null)

_no_limits := {"counters": [], "unlimited": [], "effective": {}}

# Every candidate (the model's own targets, then its fallbacks') is re-authorised
# against the same entitlements as the requested model (seed §4.8). A routing layer's
# substitute is served the same way; it is taken only when it is granted and keeps at
# least one authorised target, else the model so far stays (it passed every check) and
# the refused substitution is recorded.
_authorise(principal, request, model, facts) := plan if {
	granted := data.portcullis.access.entitlements(principal)
	requires := object.get(request, "requires", [])
	requested := _serve(principal.team, granted, requires, model)
	routed := _routed(principal, request, granted, requires, requested, facts)
	route := routed.route
	integrity := data.portcullis.integrity.for_principal(principal)
	refused_tools := data.portcullis.integrity.tools_refused(integrity, object.get(request, "tools", []))
	plan := _plan(
		request,
		route.model,
		_authorisation(object.get(granted.models, model, false), route.guardrails.conflict, route, refused_tools),
		route.targets,
		[object.union(candidate, {"reasons": _rejections(granted, requires, route.guardrails.unserved, candidate)}) |
			some i, candidate in route.candidates
			not i in route.authorised
		],
		data.portcullis.governance.limits(principal),
		data.portcullis.pii.for_principal(principal),
		integrity,
		route.guardrails.guardrail,
		_routing(model, route.model, routed.layers),
	)
}

# The layers that may substitute the model, L4 intent then L3 budget tiers, each on the
# route so far: {"route", "layers": what each proposed}. They decide from facts only,
# so a request the gateway measured nothing for them (no router or budget tier covers
# it: at most the breakers fact, which only narrows targets) is not routed, and costs
# nothing more. The facts they read: intent's features, session, classifier; budgets.
_routed(principal, request, granted, requires, requested, facts) := {"route": requested, "layers": []} if {
	facts == {}
} else := {"route": requested, "layers": []} if {
	not granted.models[requested.model] # refused at L2 (see _proposes): no proposal is asked for
} else := {"route": requested, "layers": []} if {
	count(object.filter(facts, ["features", "session", "classifier", "budgets"])) == 0
} else := {"route": by_budget.route, "layers": array.concat(by_intent.layers, by_budget.layers)} if {
	by_intent := _substitute(granted, requires, principal.team, requested, "intent", data.portcullis.intent.proposal(principal, request, requested.model, facts), facts)
	model := by_intent.route.model
	by_budget := _substitute(granted, requires, principal.team, by_intent.route, "budget_tier", data.portcullis.budget_tiers.proposal(principal, request, model, facts), facts)
}

# A model's candidates and which of them this principal and request may use.
_serve(team, granted, requires, model) := route if {
	guardrails := data.portcullis.guardrails.required(team, model)
	candidates := data.portcullis.routing.candidates(model)
	permitted := [i |
		some i, candidate in candidates
		granted.models[candidate.canonical_model]
		data.portcullis.lib.target_within(granted.regions, candidate)
		not guardrails.unserved[candidate.canonical_model]
		every needed in requires {
			needed in object.get(candidate, "capabilities", [])
		}
	]
	# L6: a permitted target whose circuit breaker is open sits this request out.
	authorised := data.portcullis.breakers.available(permitted, candidates)
	route := {
		"model": model,
		"guardrails": guardrails,
		"candidates": candidates,
		"authorised": authorised,
		"targets": [candidates[i] | some i in authorised],
		"unavailable": data.portcullis.breakers.unavailable(permitted, candidates),
	}
}

# One layer's proposal ({"model", and what the layer says of it}, or null) applied to
# the route so far: {"route", "layers": [its record]}. Restrict-only: a substitute the
# principal may not use, or that has no authorised target, never replaces the model.
# A proposal of the model so far changes nothing but is recorded (from == to): the
# tier it names is part of the decision (the intent layer pins it to the session).
_substitute(granted, requires, team, current, layer, proposal, facts) := {"route": current, "layers": []} if {
	proposal == null # most requests: checked before any call
} else := {"route": current, "layers": []} if {
	not _proposes(granted, current, proposal)
} else := {"route": current, "layers": [object.union(proposal, {"layer": layer, "from": current.model, "to": current.model, "applied": true})]} if {
	proposal.model == current.model
} else := _substituted(
	current,
	substitute,
	_substitute_refusals(granted, proposal.model, substitute, facts),
	object.union(proposal, {"layer": layer, "from": current.model, "to": proposal.model}),
) if {
	substitute := _serve(team, granted, requires, proposal.model)
}

# Only a request the principal may make, and that its model can serve, is routed
# further: an L2 refusal (no grant, no target in the region lock, a guardrail conflict)
# stops the stack, so a substitute never serves what the request alone could not.
_proposes(granted, current, proposal) if {
	proposal != null
	granted.models[current.model]
	current.targets != []
	not current.guardrails.conflict
}

_substituted(current, substitute, [], record) := {"route": substitute, "layers": [object.union(record, {"applied": true})]}

_substituted(current, substitute, refusals, record) := {"route": current, "layers": [object.union(record, {"applied": false, "reasons": refusals})]} if {
	count(refusals) > 0
}

_substitute_refusals(granted, model, substitute, facts) := array.concat(
	array.concat(
		["model_not_allowed" | not granted.models[model]],
		["guardrail_conflict" | substitute.guardrails.conflict],
	),
	array.concat(
		["no_authorised_target" | granted.models[model]; substitute.targets == []],
		["context_exceeded" | _outgrows(substitute.targets, facts)],
	),
)

# A substitute none of whose targets holds the conversation as the gateway measured it
# (facts.features.input_tokens, an underestimate) would only be refused by context fit
# (L5) after the decision: the model so far serves instead. So a session pinned to a
# small tier on a short first turn keeps being served once it outgrows that tier.
_outgrows(targets, facts) if {
	tokens := facts.features.input_tokens
	targets != []
	every target in targets {
		target.context_window < tokens
	}
}

# What the routing layers did: each proposal and whether it was taken; the model the
# request resolved to when a layer replaced it, and the last layer that did.
_routing(requested, model, layers) := {"layers": layers, "substituted_from": null, "layer": null} if {
	requested == model
} else := {
	"layers": layers,
	"substituted_from": requested,
	"layer": [record.layer | some record in layers; _changed(record)][_last(layers)],
}

_last(layers) := count([record | some record in layers; _changed(record)]) - 1

_changed(record) if {
	record.applied
	record.from != record.to
}

# Why a candidate was refused, for the plan and the audit record (breaker_open: L6).
_rejections(granted, requires, unserved, candidate) := array.concat(
	array.concat(
		["model_not_allowed" | not granted.models[candidate.canonical_model]],
		["region_not_allowed" | not data.portcullis.lib.target_within(granted.regions, candidate)],
	),
	array.concat(
		["guardrail_conflict" | unserved[candidate.canonical_model]],
		# object.get: `not x in <undefined>` is true in regorus but undefined in OPA
		array.concat(
			["capability_unsupported" | some needed in requires; not needed in object.get(candidate, "capabilities", [])],
			data.portcullis.breakers.rejection(candidate),
		),
	),
)

_authorisation(model_granted, guardrail_conflict, route, refused_tools) := [{"code": "model_not_allowed", "message": "the requested model is not allowed for this key"}] if {
	not model_granted
} else := [{"code": "guardrail_conflict", "message": "this team and the requested model require different Bedrock guardrails; the policy bundle must settle on one"}] if {
	guardrail_conflict
} else := [{
	"code": "targets_unavailable",
	"message": "every target of the requested model is unavailable right now (circuit breakers open); try again later",
	"retry_at": data.portcullis.breakers.retry_at(route.unavailable),
}] if {
	route.targets == []
	count(route.unavailable) > 0
} else := [{"code": "no_authorised_target", "message": "no target of the requested model is allowed for this key and request"}] if {
	route.targets == []
} else := [{"code": "tool_not_allowed", "message": "the request offers tools this team's policy does not allow", "tools": refused_tools}] if {
	count(refused_tools) > 0
} else := [{"code": "allowed", "message": "request authorised"}]
