# Bedrock Guardrails required by policy. A team (tenants.teams.T.guardrail) and a
# canonical model (catalog.models.M.guardrail) may each require one; Bedrock applies
# one guardrail per request, so the plan carries exactly one or none. Merged so that
# no request gets a weaker guardrail than either requires:
# - only one requires a guardrail: that one;
# - both name the same guardrail (identifier and version): it, with the fuller trace;
# - they differ: the request is refused (guardrail_conflict), since serving either
#   would drop the other;
# - a fallback model whose own requirement is not the plan's guardrail is rejected as
#   a target (guardrail_conflict), so a fallback never serves with a weaker one.
package portcullis.guardrails

_trace_detail := {"disabled": 0, "enabled": 1, "enabled_full": 2}

# {"guardrail": the plan's guardrail or null, "conflict": whether the team's and the
# model's requirements differ, "unserved": {canonical model of the candidate chain:
# true} for each whose own requirement the plan's guardrail does not meet}. Two keyed
# lookups (the team, the model's chain in the index) and no per-candidate calls: the
# decision checks candidates against `unserved` with a lookup each.
required(team, model) := _required(object.get(data.portcullis.tenants.teams[team], "guardrail", null), chain, model) if {
	chain := data.portcullis.compiled.guardrails[model]
} else := _required(object.get(data.portcullis.tenants.teams[team], "guardrail", null), _requirements_of(model), model)

# This package's part of the per-bundle index: per model, the requirement of every
# model in its candidate chain that has one (most chains have none).
index := {model: _requirements_of(model) | some model, _ in data.portcullis.catalog.models}

_requirements_of(model) := {member: _normal(guardrail) |
	some candidate in data.portcullis.routing.candidates(model)
	member := candidate.canonical_model
	guardrail := data.portcullis.catalog.models[member].guardrail
}

_required(team, chain, model) := {"guardrail": null, "conflict": false, "unserved": {}} if {
	team == null
	chain == {}
} else := {"guardrail": guardrail, "conflict": false, "unserved": _unserved(guardrail, chain)} if {
	guardrail := _plan_guardrail(team, object.get(chain, model, null))
} else := {"guardrail": null, "conflict": true, "unserved": _unserved(null, chain)}

# Undefined when the team's and the model's differ: that is the conflict.
_plan_guardrail(team, model) := model if {
	team == null
} else := _normal(team) if {
	model == null
} else := _fuller(_normal(team), model) if {
	_same(team, model)
}

_unserved(guardrail, chain) := {member: true | some member, needed in chain; not _same(guardrail, needed)}

_same(a, b) if {
	a.identifier == b.identifier
	a.version == b.version
}

# Trace is how much of the guardrail's assessment comes back; the fuller one wins, so
# whoever asked for a trace gets it.
_fuller(team, model) := team if {
	_trace_detail[team.trace] >= _trace_detail[model.trace]
} else := model

_normal(guardrail) := {
	"identifier": guardrail.identifier,
	"version": guardrail.version,
	"trace": object.get(guardrail, "trace", "disabled"),
}
