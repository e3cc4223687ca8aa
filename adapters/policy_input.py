"""The policy's input document, from what the gateway knows of a request, and the
decision it gets back. Python gathers facts; the bundle decides."""

from __future__ import annotations

import logging

from portcullis.adapters.auth import Principal
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.rego import PolicyError

log = logging.getLogger("portcullis.gateway")


def decide(bundle: ActiveBundle, principal: Principal, request: ParsedRequest) -> DecisionPlan:
    input_document = {
        "principal": principal.as_input(),
        "request": {
            "protocol": request.protocol,
            "model": request.model,
            "stream": request.stream,
            "max_tokens": request.max_tokens,
            "requires": request.requires,
            "tools": request.tools,
        },
    }
    try:
        return bundle.decide(input_document)
    except PolicyError as error:  # a broken policy refuses; it never lets a request through
        log.error("policy evaluation failed: %s", error)
        raise GatewayError(ErrorKind.INTERNAL, "the gateway's policy could not decide this request", code="policy_error") from None
