# Routing layer L5, context fit: `portcullis policy test policies policy-tests`.
package portcullis.context_fit_test

small := {"index": 0, "context_window": 10000, "max_output_tokens": 4096, "input_tokens": 8000, "method": "exact"}

large := {"index": 1, "context_window": 200000, "max_output_tokens": 8192, "input_tokens": 8000, "method": "exact"}

capped(targets, output) := data.portcullis.context_fit.verdicts({"targets": targets, "output_tokens": output, "reasoning_tokens": null, "reasoning_effort": null})

test_a_request_within_the_window_fits if {
	[verdict] := capped([small], 2000)
	verdict.fits
	verdict.reasons == []
	verdict.input_tokens + verdict.output_tokens == 10000
}

test_one_token_over_the_window_is_context_exceeded_with_the_numbers if {
	[verdict] := capped([small], 2001)
	not verdict.fits
	verdict.reasons == ["context_exceeded"]
	verdict.input_tokens == 8000
	verdict.output_tokens == 2001
	verdict.context_window == 10000
	verdict.method == "exact"
}

test_each_target_is_judged_on_its_own_window_in_order if {
	verdicts := capped([small, large], 4000)
	[v.index | some v in verdicts] == [0, 1]
	[v.fits | some v in verdicts] == [false, true]
}

test_the_output_counts_no_more_than_the_targets_ceiling if {
	[verdict] := capped([large], 100000)
	verdict.output_tokens == 8192
	verdict.fits
}

test_an_estimate_carries_the_declared_margin if {
	estimate := object.union(small, {"method": "estimate", "input_tokens": 9000})
	[verdict] := capped([estimate], 101)
	verdict.margin_tokens == 900
	verdict.reasons == ["context_exceeded"] # 9000 + 900 + 101 > 10000 although 9000 + 101 would fit
}

test_the_margin_is_the_bundles_data if {
	estimate := object.union(small, {"method": "estimate", "input_tokens": 9000})
	[verdict] := capped([estimate], 100) with data.portcullis.context_fit.estimate_margin_percent as 5
	verdict.margin_tokens == 450
	verdict.fits
}

test_an_upper_bound_and_an_exact_count_have_no_margin_by_default if {
	bound := object.union(small, {"method": "upper_bound"})
	verdicts := capped([bound, small], 100)
	[v.margin_tokens | some v in verdicts] == [0, 0]
}

test_without_an_output_limit_the_default_answer_must_fit if {
	tight := object.union(small, {"input_tokens": 9000})
	[verdict] := capped([tight], null)
	verdict.output_tokens == 1024
	verdict.reasons == ["context_exceeded"]
	[fits] := capped([tight], null) with data.portcullis.context_fit.default_output_tokens as 1000
	fits.fits
}

test_a_named_effort_adds_its_allowance_when_there_is_no_output_limit if {
	[verdict] := data.portcullis.context_fit_verdicts with input as {"targets": [large], "output_tokens": null, "reasoning_tokens": null, "reasoning_effort": "low"}
	verdict.reasoning_tokens == 2048
	verdict.output_tokens == 1024 + 2048
}

test_a_named_effort_stays_within_an_output_limit if {
	[verdict] := data.portcullis.context_fit_verdicts with input as {"targets": [large], "output_tokens": 500, "reasoning_tokens": null, "reasoning_effort": "high"}
	verdict.output_tokens == 500
	verdict.fits
}

test_an_unknown_effort_counts_nothing if {
	[verdict] := data.portcullis.context_fit_verdicts with input as {"targets": [large], "output_tokens": null, "reasoning_tokens": null, "reasoning_effort": "galactic"}
	verdict.reasoning_tokens == 0
}

test_a_declared_budget_at_or_over_the_output_ceiling_is_output_exceeded if {
	[verdict] := data.portcullis.context_fit_verdicts with input as {"targets": [small], "output_tokens": 1000, "reasoning_tokens": 4096, "reasoning_effort": null}
	verdict.reasons == ["output_exceeded"]
	[within] := data.portcullis.context_fit_verdicts with input as {"targets": [small], "output_tokens": 1000, "reasoning_tokens": 900, "reasoning_effort": null}
	within.fits
	within.reasoning_tokens == 900
}

test_both_reasons_are_named_when_both_fail if {
	over := object.union(small, {"input_tokens": 9990})
	[verdict] := data.portcullis.context_fit_verdicts with input as {"targets": [over], "output_tokens": 4096, "reasoning_tokens": 5000, "reasoning_effort": null}
	verdict.reasons == ["context_exceeded", "output_exceeded"]
}

test_no_targets_no_verdicts if {
	capped([], 10) == []
}

test_the_screen_takes_the_largest_margin_and_the_largest_uncapped_allowance if {
	screen := data.portcullis.context_fit.index.screen
	screen.margin_percent == 10
	screen.output_tokens == 1024 + 65536
	tighter := data.portcullis.context_fit.index.screen with data.portcullis.context_fit.exact_margin_percent as 30
	tighter.margin_percent == 30
}
