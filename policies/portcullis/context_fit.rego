# METADATA
# title: Context fit (routing layer L5)
# description: >-
#   Whether each authorised target can take the request as it will be sent: the
#   transformed input (with a declared margin for counts that are estimates), plus
#   the output the request may generate (its reasoning budget included), within the
#   target's context window; and a declared reasoning budget within its output ceiling.
package portcullis.context_fit

# What applies when data.portcullis.context_fit leaves a setting out.
_defaults := {
	"exact_margin_percent": 0,
	"estimate_margin_percent": 10,
	"upper_bound_margin_percent": 0,
	"default_output_tokens": 1024,
	"reasoning_effort_tokens": {"none": 0, "minimal": 0, "low": 2048, "medium": 8192, "high": 32768, "xhigh": 65536},
}

_settings := {name: value |
	some name, fallback in _defaults
	value := _setting(name, fallback)
}

_setting(name, fallback) := value if {
	name != "reasoning_effort_tokens"
	value := data.portcullis.context_fit[name]
} else := value if {
	name == "reasoning_effort_tokens"
	value := object.union(fallback, data.portcullis.context_fit.reasoning_effort_tokens)
} else := fallback

_margins := {
	"exact": _settings.exact_margin_percent,
	"estimate": _settings.estimate_margin_percent,
	"upper_bound": _settings.upper_bound_margin_percent,
}

# One verdict per input.targets entry, in order. The request is
# {targets: [{index, context_window, max_output_tokens, input_tokens, method}],
#  output_tokens (the client's cap, or null), reasoning_tokens (a declared budget, or
#  null), reasoning_effort (a named effort, or null)}.
verdicts(request) := [_verdict(target, reasoning, request) |
	reasoning := _reasoning(request)
	some target in request.targets
]

# A declared budget counts as given; a named effort as the allowance the data sets for it.
_reasoning(request) := request.reasoning_tokens if {
	is_number(request.reasoning_tokens)
} else := object.get(_settings.reasoning_effort_tokens, request.reasoning_effort, 0) if {
	is_string(request.reasoning_effort)
} else := 0

# Every protocol counts reasoning within the client's output cap (max_tokens,
# max_completion_tokens, max_output_tokens, maxTokens). Without a cap the request
# must leave room for the default answer and its reasoning. Either way no more than
# the target's own output ceiling, which the gateway never lets an answer pass.
_output(request, reasoning, target) := min([request.output_tokens, target.max_output_tokens]) if {
	is_number(request.output_tokens)
} else := min([_settings.default_output_tokens + reasoning, target.max_output_tokens])

_verdict(target, reasoning, request) := verdict if {
	margin := ceil((target.input_tokens * _margins[target.method]) / 100)
	output := _output(request, reasoning, target)
	reasons := [reason | some reason, failed in {
		"context_exceeded": ((target.input_tokens + margin) + output) > target.context_window,
		"output_exceeded": _budget_exceeds(request, target),
	}; failed]
	verdict := {
		"index": target.index,
		"fits": count(reasons) == 0,
		"reasons": reasons,
		"input_tokens": target.input_tokens,
		"margin_tokens": margin,
		"output_tokens": output,
		"reasoning_tokens": reasoning,
		"context_window": target.context_window,
		"method": target.method,
	}
}

# A declared reasoning budget must be below the output ceiling it is spent within.
_budget_exceeds(request, target) if {
	is_number(request.reasoning_tokens)
	request.reasoning_tokens >= target.max_output_tokens
}

default _budget_exceeds(_, _) := false
