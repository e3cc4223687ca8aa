"""The pipeline's vocabulary: one request's ``Exchange``, the ``Step``s that admit and
settle it, and the ``ResponseGuard``s that see its answer.

The executor runs the stages (authenticate · parse · decide · admit · dispatch ·
guard · relay · settle · audit) and knows steps only through ``Step``; a step knows
the executor only through the ``Exchange``. Neither imports the other, so a new step
(a router, a paid guard) plugs in without either changing.

What a step decides for dispatch travels back as an explicit ``Admission``, never as
attributes set on the request: whether output is capped, the tokens the request may
use, the targets it may still go to, whether it edited the outbound body. The
outbound body is one representation (``request.body``): steps edit it in place, and
the executor serialises it once, before dispatch, only if one of them changed it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from portcullis.adapters.operations import Operation
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.telemetry.tracing import NO_TRACE, Trace
from portcullis.engine.conversation import EMPTY, SESSION_SYSTEM_BLOCKS, Conversation, prefix_key, session_key
from portcullis.engine.pricing import Usage

if TYPE_CHECKING:
    from portcullis.adapters.auth import Claim, Principal
    from portcullis.adapters.protocols.interfaces import WireProtocol
    from portcullis.adapters.protocols.registry import Route
    from portcullis.adapters.protocols.request import ParsedRequest
    from portcullis.engine.activation import ActiveBundle
    from portcullis.engine.errors import GatewayError
    from portcullis.engine.plan import DecisionPlan, Target

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


S = TypeVar("S")


@dataclass(frozen=True)
class Admission(Generic[S]):
    """What one step decided for a request it admitted. ``state`` is the step's own
    (given back to its ``settle``, ``guards`` and ``outbound_headers``); the rest are
    facts for dispatch, which the executor merges over every step."""

    state: S
    cap_output: bool = False  # every upstream body names an output limit within the target's ceiling
    bound_tokens: int = 0  # the tokens the request may use, for provider key capacity
    targets: tuple[Target, ...] | None = None  # only these of the authorised targets may serve it
    body_changed: bool = False  # the step edited request.body: it is serialised again before dispatch
    first: Target | None = None  # tried before the others, if still among the targets (order only: never adds one)


@dataclass
class Exchange:
    """One request as it moves through the stages. Steps read it and add to its audit
    records and response headers (counts and ids, never content)."""

    request_id: str
    protocol: WireProtocol  # the client's
    started: float  # monotonic, for durations and the request deadline
    arrived: dt.datetime  # from the gateway's clock: prices and periods in effect for the whole request
    operation: Operation = Operation.INFERENCE  # what the route asked for
    principal: Principal | None = None
    claim: Claim | None = None  # how it authenticated (a SigV4 signature is released if nothing is served)
    request: ParsedRequest | None = None
    bundle: ActiveBundle | None = None
    plan: DecisionPlan | None = None
    targets: tuple[Target, ...] = ()  # the plan's targets, as the steps narrowed them
    rejected_targets: list[dict[str, Any]] = field(default_factory=list)  # targets steps turned away, and why: audited after the plan's
    cap_output: bool = False
    bound_tokens: int = 0
    body_changed: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    served: Target | None = None
    usage: Usage = field(default_factory=Usage)
    usage_complete: bool = False
    cost_micro_usd: int | None = None
    price_version: str | None = None
    states: dict[int, Any] = field(default_factory=dict, repr=False)  # id(step) -> its admitted state
    audit_started: dict[str, Any] = field(default_factory=dict)
    audit_outcome: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # what steps tell the client, on a served answer
    facts: dict[str, Any] = field(default_factory=dict)  # what the routing layers were told (input.facts)
    first_upstream_at: float | None = None  # monotonic: a stream's first event from the provider
    first_client_at: float | None = None  # monotonic: its first bytes to the client, after the guards
    trace: Trace = field(default=NO_TRACE, repr=False)  # its spans, when traces are exported
    _conversation: Conversation | None = field(default=None, repr=False)
    _session_key: str | None = field(default=None, repr=False)

    @property
    def day(self) -> dt.date:
        return self.arrived.date()

    def admitted(self, step: Step[S], admission: Admission[S] | None) -> None:
        """Record what ``step`` decided and merge its dispatch facts."""
        if admission is None:
            return
        self.states[id(step)] = admission.state
        self.cap_output = self.cap_output or admission.cap_output
        self.bound_tokens = max(self.bound_tokens, admission.bound_tokens)
        self.body_changed = self.body_changed or admission.body_changed
        if admission.targets is not None:
            allowed = set(admission.targets)
            self.targets = tuple(target for target in self.targets if target in allowed)
        if admission.first is not None and admission.first in self.targets:
            self.targets = (admission.first, *(target for target in self.targets if target != admission.first))

    def state_of(self, step: Step[S]) -> S | None:
        return self.states.get(id(step))

    def conversation(self) -> Conversation:
        """The request as the client sent it, seen as a conversation (computed once)."""
        if self._conversation is None:
            self._conversation = self.protocol.surfaces.conversation(self.request.body) if self.request is not None else EMPTY
        return self._conversation

    def session_key(self) -> str:
        """The session this request belongs to, one key for every layer that keeps state
        per session (a pinned tier, the cache domain): the client's session id when it
        sends one, else the conversation's stable prefix; scoped to the principal."""
        if self._session_key is None:
            assert self.principal is not None and self.request is not None
            team, request = self.principal.team, self.request
            prefix = prefix_key(team, request.tools, self.conversation(), SESSION_SYSTEM_BLOCKS)
            self._session_key = session_key(team, self.principal.user, request.session, prefix)
        return self._session_key


class FactSource:
    """What the gateway measures for the routing layers before the policy decides: its
    ``gather`` becomes ``input.facts[name]`` (None: not known, and left out). Once every
    step has admitted the request, ``decided`` records what the plan settled that must
    outlive it (a tier pinned to the session). A fact that cannot be had is absent, and
    the policy decides what absence means: the executor leaves out the fact of a source
    that raises, and logs only the error's type."""

    name: ClassVar[str]
    # The facts of other sources this one reads: it is gathered once they are in
    # (sources are otherwise gathered side by side).
    reads: ClassVar[tuple[str, ...]] = ()

    async def gather(self, exchange: Exchange) -> Any:
        return None

    async def decided(self, exchange: Exchange) -> None:
        return None


class ResponseGuard(Protocol):
    """Sees an answer before the client does and may change or withhold it (a
    GatewayError). Streams pass through ``events`` and may be held back in order;
    ``finish`` releases what is still held when the stream ends."""

    async def document(self, document: dict[str, Any]) -> bool: ...
    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]: ...
    async def finish(self) -> list[SSEEvent]: ...


class Step(Generic[S]):
    """A stage that is not the executor's own. ``admit`` runs before dispatch and may
    refuse (a GatewayError); ``settle`` runs once after the outcome is known, whatever
    it was, for every step that admitted the request, and must not raise. ``state`` is
    what this step's ``admit`` returned. A step runs only for the ``operations`` it
    names: a request of another operation never reaches it."""

    operations: ClassVar[frozenset[Operation]] = frozenset({Operation.INFERENCE})
    layer: ClassVar[str] = "step"  # what a refusal by this step is counted as (auth, rate, pii, integrity, budget, ...)

    async def admit(self, exchange: Exchange) -> Admission[S] | None:
        return None

    async def settle(self, exchange: Exchange, state: S) -> None:
        return None

    def outbound_headers(self, exchange: Exchange, state: S, provider: str) -> dict[str, str]:
        """Headers this step adds to the request sent to ``provider`` (never credentials)."""
        return {}

    def guards(self, exchange: Exchange, state: S, pair: Route) -> list[ResponseGuard]:
        """Guards for this request's answer, in the order they see it. They read it in the
        provider's protocol (``pair.upstream``), before any conversion; a tool call is
        judged as the client will receive it (``pair.client_call``)."""
        return []


class RequestObserver(Protocol):
    """Told of every request once it has ended, whatever the outcome (``ok``, ``failed``,
    ``cancelled``, ``counted``, ``refused``); a refusal says at which ``stage`` and, when
    a step refused it, that step's ``layer``. Must be quick and must not raise."""

    def finished(self, exchange: Exchange, outcome: str, error: GatewayError | None = None, stage: str | None = None, layer: str | None = None) -> None: ...
