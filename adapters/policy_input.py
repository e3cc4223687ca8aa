"""The policy's input document, from what the gateway knows of a request, and the
decision it gets back. Python gathers facts; the bundle decides."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.auth import Principal
from portcullis.adapters.json_bytes import compact
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.rego import PolicyError

log = logging.getLogger("portcullis.gateway")


def decide(bundle: ActiveBundle, principal: Principal, request: ParsedRequest, facts: Mapping[str, Any] | None = None) -> DecisionPlan:
    document = input_document(principal, request, facts)
    try:
        return bundle.decide(document, _encoded(document))
    except PolicyError as error:  # a broken policy refuses; it never lets a request through
        log.error("policy evaluation failed: %s", error)
        raise GatewayError(ErrorKind.INTERNAL, "the gateway's policy could not decide this request", code="policy_error") from None


def input_document(principal: Principal, request: ParsedRequest, facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The policy's input document for one request (``policy eval`` builds it here too)."""
    document: dict[str, Any] = {
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
    if facts:  # only when there are some: equal inputs share one cached evaluation
        document["facts"] = facts
    return document


def _encoded(input_document: dict[str, Any]) -> str | None:
    """The document as JSON, the fast way (json_bytes: ~6x faster than json.dumps); None
    (the bundle encodes it, ASCII-escaped) for text UTF-8 cannot hold, a lone surrogate."""
    try:
        return compact(input_document).decode()
    except UnicodeEncodeError:
        return None
