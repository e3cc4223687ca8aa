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
# model's requirements differ}.
required(team, model) := _merge(_team_requires(team), _model_requires(model))

# Whether a candidate of `model` may serve a request carrying `guardrail`: its
# canonical model requires none, or requires that same guardrail.
serves(guardrail, model) if {
	_same(guardrail, _model_requires(model))
}

serves(_, model) if {
	_model_requires(model) == null
}

_team_requires(team) := object.get(data.portcullis.tenants.teams[team], "guardrail", null)

_model_requires(model) := object.get(data.portcullis.catalog.models[model], "guardrail", null)

_merge(null, null) := {"guardrail": null, "conflict": false}

_merge(team, null) := {"guardrail": _normal(team), "conflict": false} if team != null

_merge(null, model) := {"guardrail": _normal(model), "conflict": false} if model != null

_merge(team, model) := {"guardrail": _fuller(team, model), "conflict": false} if {
	team != null
	_same(team, model)
}

_merge(team, model) := {"guardrail": null, "conflict": true} if {
	team != null
	model != null
	not _same(team, model)
}

_same(a, b) if {
	a.identifier == b.identifier
	a.version == b.version
}

# Trace is how much of the guardrail's assessment comes back; the fuller one wins, so
# whoever asked for a trace gets it.
_fuller(team, model) := _normal(team) if {
	_trace_detail[_normal(team).trace] >= _trace_detail[_normal(model).trace]
} else := _normal(model)

_normal(guardrail) := {
	"identifier": guardrail.identifier,
	"version": guardrail.version,
	"trace": object.get(guardrail, "trace", "disabled"),
}
