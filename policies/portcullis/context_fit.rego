# METADATA
# title: Context fit (routing layer L5)
# description: >-
#   Whether each authorised target can take the request as it will be sent: the
#   transformed input (with a declared margin for counts that are estimates), plus
#   the output the request may generate (its reasoning budget included), within the
#   target's context window; and a declared reasoning budget within its output ceiling.
package portcullis.context_fit

# This package's part of the per-bundle index: the settings with their defaults filled
# in and the margin of each counting method, so a request reads them with one lookup;
# and the screen, the gateway's shortcut this bundle allows: a target whose input plus
# the largest margin and the largest output allowance (the client's cap when it sent
# one), within its output ceiling, fits its window, on a request that declares no
# reasoning budget, is admitted without evaluating verdicts. Every target it admits,
# verdicts would admit too. Leave `screen` out to have every request judged here.
index := object.union(_configured, {
	"margins": _margins,
	"screen": {
		"margin_percent": max([margin | some margin in _margins]),
		"output_tokens": _configured.default_output_tokens + max([tokens | some tokens in _configured.reasoning_effort_tokens]),
	},
})

_margins := {
	"exact": _configured.exact_margin_percent,
	"estimate": _configured.estimate_margin_percent,
	"upper_bound": _configured.upper_bound_margin_percent,
}

_settings := data.portcullis.compiled.context_fit if {
	data.portcullis.compiled.context_fit
} else := index

# The bundle's settings, each with the default that applies when the data leaves it
# out. Every key is read by its full path: a dynamic key into data.portcullis.context_fit
# would reach this package's own rules too, which OPA refuses as recursion.
_configured := {
	"exact_margin_percent": _exact_margin,
	"estimate_margin_percent": _estimate_margin,
	"upper_bound_margin_percent": _upper_bound_margin,
	"default_output_tokens": _default_output,
	"reasoning_effort_tokens": object.union(_default_efforts, _declared_efforts),
}

default _exact_margin := 0

_exact_margin := data.portcullis.context_fit.exact_margin_percent

default _estimate_margin := 10

_estimate_margin := data.portcullis.context_fit.estimate_margin_percent

default _upper_bound_margin := 0

_upper_bound_margin := data.portcullis.context_fit.upper_bound_margin_percent

default _default_output := 1024

_default_output := data.portcullis.context_fit.default_output_tokens

_default_efforts := {"none": 0, "minimal": 0, "low": 2048, "medium": 8192, "high": 32768, "xhigh": 65536}

default _declared_efforts := {}

_declared_efforts := data.portcullis.context_fit.reasoning_effort_tokens

# One verdict per input.targets entry, in order. The request is
# {targets: [{index, context_window, max_output_tokens, input_tokens, method}],
#  output_tokens (the client's cap, or null), reasoning_tokens (a declared budget, or
#  null), reasoning_effort (a named effort, or null)}.
verdicts(request) := [_verdict(target, request, reasoning, cap, budget, settings.margins) |
	settings := _settings
	reasoning := _reasoning(request, settings)
	cap := _cap(request, reasoning, settings)
	budget := _declared_budget(request)
	some target in request.targets
]

# A declared budget counts as given; a named effort as the allowance the data sets for it.
_reasoning(request, settings) := request.reasoning_tokens if {
	is_number(request.reasoning_tokens)
} else := object.get(settings.reasoning_effort_tokens, request.reasoning_effort, 0) if {
	is_string(request.reasoning_effort)
} else := 0

# Every protocol counts reasoning within the client's output cap (max_tokens,
# max_completion_tokens, max_output_tokens, maxTokens). Without a cap the request
# must leave room for the default answer and its reasoning. Either way a target gives
# no more than its own output ceiling, which the gateway never lets an answer pass.
_cap(request, reasoning, settings) := request.output_tokens if {
	is_number(request.output_tokens)
} else := settings.default_output_tokens + reasoning

# A declared reasoning budget must be below the output ceiling it is spent within; -1
# when none is declared (a named effort is an allowance, not the client's number).
_declared_budget(request) := request.reasoning_tokens if {
	is_number(request.reasoning_tokens)
} else := -1

# The reasons for [context exceeded][budget over the output ceiling].
_reasons := {
	false: {false: [], true: ["output_exceeded"]},
	true: {false: ["context_exceeded"], true: ["context_exceeded", "output_exceeded"]},
}

_verdict(target, request, reasoning, cap, budget, margins) := {
	"index": target.index,
	"fits": count(reasons) == 0,
	"reasons": reasons,
	"input_tokens": target.input_tokens,
	"margin_tokens": margin,
	"output_tokens": output,
	"reasoning_tokens": reasoning,
	"context_window": target.context_window,
	"method": target.method,
} if {
	margin := ceil((target.input_tokens * margins[target.method]) / 100)
	output := min([cap, target.max_output_tokens])
	reasons := _reasons[((target.input_tokens + margin) + output) > target.context_window][budget >= target.max_output_tokens]
}
