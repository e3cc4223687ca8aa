"""One of the gateway's own billable sub-calls (the PII classifier, the intent
classifier), sent and settled: a fixed body to the first of its targets that answers,
the answer read within a bound, and the reservation settled whatever happens. Whether
the provider answered at all decides what settles: an answer means it may have done,
and billed, the work, so the reservation is charged even when the answer is unusable."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from portcullis.adapters.dispatch import Attempt, Call, Dispatcher
from portcullis.adapters.providers import UpstreamUnreachable
from portcullis.adapters.upstream_errors import TryNext, unreachable
from portcullis.engine.plan import Target
from portcullis.engine.pricing import Price, Usage

if TYPE_CHECKING:
    from portcullis.adapters.governance import Governance
    from portcullis.adapters.protocols.interfaces import Wire
    from portcullis.adapters.protocols.registry import Route
    from portcullis.adapters.store.ledger import Reservation

T = TypeVar("T")


@dataclass
class _Outcome:
    served: Target | None = None  # the target that answered 2xx
    usage: Usage | None = None


async def ask(
    dispatcher: Dispatcher,
    governance: Governance,
    reservation: Reservation | None,
    price: Price,
    call: tuple[str, str, Sequence[Target], bytes, int],
    limit: int,
    read: Callable[[Wire, Any], T],
) -> T:
    """Send ``call`` (request id, protocol, targets, body, tokens) and give the answer's
    JSON document to ``read`` with the answering target's wire. A body that is not JSON
    raises ValueError; no target answering raises DispatchFailed. Either way, and on
    success, ``reservation`` is settled from what the provider reported."""
    request_id, protocol, targets, body, tokens = call
    outcome = _Outcome()

    async def prepared(pair: Route, target: Target) -> bytes:
        return body

    sent = Call(request_id, protocol, targets, prepared, tokens=tokens)

    async def answer(attempt: Attempt) -> T:
        return read(attempt.route.upstream.wire, await _document(attempt, sent, outcome, limit))

    try:
        return await dispatcher.dispatch(sent, answer)
    finally:
        if reservation is not None:
            cost = price.cost(outcome.usage) if outcome.usage is not None else 0
            await governance.settle_subcall(reservation, outcome.usage, cost, outcome.served)


async def _document(attempt: Attempt, call: Call, outcome: _Outcome, limit: int) -> Any:
    outcome.served = attempt.target
    try:
        raw = await attempt.upstream.read(limit)
    except UpstreamUnreachable as failure:  # lost while reading: the call's next target
        raise TryNext(failure.reason, unreachable(failure)) from None
    finally:
        attempt.upstream.release()
    call.record(attempt.target, "ok", attempt.upstream.status)
    document = json.loads(raw)
    outcome.usage = attempt.route.upstream.wire.usage_of(document) if isinstance(document, dict) else None
    return document
