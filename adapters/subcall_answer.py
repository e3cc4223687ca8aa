"""How the gateway reads the answer to one of its own billable sub-calls (the PII
classifier, the intent classifier): the body within a bound, the attempt recorded as
served, the usage the provider reported kept for settlement. Whether the provider
answered at all decides what settles: an answer means it may have done, and billed,
the work, so the reservation is charged even when the answer is unusable."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.dispatch import Attempt, Call
from portcullis.adapters.providers import UpstreamUnreachable
from portcullis.adapters.upstream_errors import TryNext, unreachable
from portcullis.engine.plan import Target
from portcullis.engine.pricing import Usage


@dataclass
class SubcallOutcome:
    served: Target | None = None  # the target that answered 2xx
    usage: Usage | None = None


async def read_answer(attempt: Attempt, call: Call, outcome: SubcallOutcome, limit: int) -> Any:
    """The answer's JSON document (a ValueError when it is not JSON); a connection lost
    while reading moves on to the call's next target."""
    outcome.served = attempt.target
    try:
        raw = await attempt.upstream.read(limit)
    except UpstreamUnreachable as failure:
        raise TryNext(failure.reason, unreachable(failure)) from None
    finally:
        attempt.upstream.release()
    call.record(attempt.target, "ok", attempt.upstream.status)
    document = json.loads(raw)
    outcome.usage = attempt.route.upstream.wire.usage_of(document) if isinstance(document, dict) else None
    return document
