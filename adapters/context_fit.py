"""Routing layer L5 at request time: the bundle's context-fit verdicts for the
targets governance has sized, before anything is reserved (``engine/context_fit.py``
says what is decided; here is when, and what is counted again).

When the bundle's screen admits every target (each fits with room to spare), the
rule is not evaluated at all. A target refused on its byte upper bound may still fit: only then is the input
counted with tiktoken, labelled an estimate (the bundle's margin applies), and judged
a second time. A request that fits on its first verdict costs one small evaluation
and no extra count.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.context_fit import ESTIMATE, UPPER_BOUND, Generation, Sized, Verdict, fit_input, read_verdicts
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.rego import PolicyError

log = logging.getLogger("portcullis.context_fit")


def generation_of(request: ParsedRequest) -> Generation:
    return Generation(request.max_tokens, request.reasoning_tokens, request.reasoning_effort)


async def judge(bundle: ActiveBundle, request: ParsedRequest, sized: Sequence[Sized], estimate: Callable[[], Awaitable[int]]) -> list[Verdict]:
    """One verdict per sized target, in order. ``estimate`` counts the input with
    tiktoken; it is called at most once, and only for a target its upper bound refused."""
    generation = generation_of(request)
    if bundle.fit_screen is not None and bundle.fit_screen.admits(sized, generation):
        return [Verdict(item.target, True, (), item.input_tokens, 0, 0, 0, item.method, screened=True) for item in sized]
    verdicts = _verdicts(bundle, sized, generation)
    again = [index for index, verdict in enumerate(verdicts) if not verdict.fits and verdict.method == UPPER_BOUND]
    if again:
        tokens = await estimate()
        recounted = [replace(sized[index], input_tokens=tokens, method=ESTIMATE) for index in again]
        for index, verdict in zip(again, _verdicts(bundle, recounted, generation), strict=True):
            verdicts[index] = verdict
    return verdicts


def _verdicts(bundle: ActiveBundle, sized: Sequence[Sized], generation: Generation) -> list[Verdict]:
    try:
        return read_verdicts(sized, bundle.context_fit(fit_input(sized, generation)))
    except (PolicyError, ValueError, KeyError, TypeError) as error:  # a broken policy refuses; it never lets a request through
        log.error("context fit evaluation failed: %s", error)
        raise GatewayError(ErrorKind.INTERNAL, "the gateway's policy could not decide this request", code="policy_error") from None
