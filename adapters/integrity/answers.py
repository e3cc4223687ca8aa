"""Stage 8 for prompt integrity: the model's tool calls against the team's allow-list
(layer D) and the answer's text through the output guard (layer E), before the
client sees either. Both work in the provider's protocol, on whole answers and on
streams."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from portcullis.adapters.held_text import HeldTextGuard
from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import PROVIDER_RUN, StreamText, ToolCall, denial_text, read_strings
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity import output
from portcullis.engine.integrity.policy import IntegrityPolicy
from portcullis.engine.pii.policy import SIGNED

Judge = Callable[[ToolCall], "str | None"]  # a denial reason, or None to allow
CONTEXT_CHARS = 256  # released text a stream's next piece is scanned with


class ToolCallGuard:
    """Each tool call is judged once complete; a denied one never reaches the client:
    a text saying the gateway's policy denied it takes its place."""

    def __init__(self, upstream: WireProtocol, judge: Judge) -> None:
        self._upstream = upstream
        self._judge = judge
        self._stream: Any = None

    def __repr__(self) -> str:
        return "ToolCallGuard()"

    async def document(self, document: dict[str, Any]) -> bool:
        denials = {}
        for position, call in self._upstream.tools.answer_tool_calls(document):
            reason = self._judge(call)
            if reason is not None:
                denials[position] = denial_text(call, reason)
        if denials:
            self._upstream.tools.deny_tool_calls(document, denials)
        return bool(denials)

    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]:
        if self._stream is None:
            self._stream = self._upstream.tools.ToolCallStream(self._judge)
        return [out for event in events for out in self._stream.feed(event)]

    async def finish(self) -> list[SSEEvent]:
        return self._stream.finish() if self._stream is not None else []


def withheld(kind: str) -> GatewayError:
    return GatewayError(ErrorKind.PERMISSION, f"the answer was withheld by the gateway's output policy ({kind})", code="output_withheld")


@dataclass
class _Written:
    """One stream channel as the output guard has judged it so far."""

    context: str = field(default="", repr=False)  # the last text, as the model wrote it (not as it went out)
    length: int = 0  # characters judged: where ``context`` ends in the channel
    seen: set[tuple[str, int]] = field(default_factory=set)  # findings counted, by kind and start in the channel
    image_labels: set[str] = field(default_factory=set)  # reference labels images used so far


class OutputGuard(HeldTextGuard):
    """The answer's text and reasoning are scanned for the canary, secrets and
    data-carrying URLs; each finding is withheld, redacted or flagged as the policy
    says, and counted in the audit record. Signed reasoning cannot change, so there a
    redaction becomes a flag. Tool-call arguments are not this guard's: they are judged
    whole, decoded, with the call (``inspect_arguments``). In a stream the trailing word
    is held only while it could still become a finding, and each piece is scanned with
    the text written before it on its channel, so a finding split across deltas is
    still seen (redacted from the part not yet released)."""

    reads_signed = True

    def __init__(self, upstream: WireProtocol, policy: IntegrityPolicy, audit_outcome: dict[str, Any]) -> None:
        super().__init__(upstream)
        self._actions = dict(policy.output_actions)
        self._canaries = policy.prompt.canaries if policy.prompt is not None else ()
        self._hosts = policy.allowed_hosts
        self._audit = audit_outcome
        self._channels: dict[Any, _Written] = {}
        self._provider_run: set[Any] = set()  # channels of calls the provider already ran: read, never changed

    def __repr__(self) -> str:
        return "OutputGuard()"

    async def document(self, document: dict[str, Any]) -> bool:
        changed = False

        def guard(surface: str, text: str) -> str:
            nonlocal changed
            if surface == "tool_arguments":  # the tool-call guard's
                return text
            result = self._judge(text, _Written(), changeable=surface not in (SIGNED, PROVIDER_RUN))
            changed = changed or result != text
            return result

        self.upstream.surfaces.visit_answer(document, guard)
        return changed

    async def _look_into(self, waiting: Any) -> None:
        await super()._look_into(waiting)
        # After the event's own pieces: an event that opens a call carries none of its arguments yet.
        opened = self.upstream.surfaces.provider_run_block(waiting.document) if isinstance(waiting.document, dict) else None
        if opened is not None:
            self._provider_run.add(opened)

    def _judged_elsewhere(self, piece: StreamText) -> bool:
        # A channel is the block's own key, or a tuple that starts with it (an item's parts).
        block = piece.channel[0] if isinstance(piece.channel, tuple) else piece.channel
        return piece.arguments and piece.channel not in self._provider_run and block not in self._provider_run

    def _cut(self, text: str, piece: StreamText) -> int:
        if self._judged_elsewhere(piece):
            return len(text)
        context = self._channels.get(piece.channel, _Written()).context  # a word may have begun in text already released
        return max(0, output.held_from(context + text, self._canaries) - len(context))

    async def _rewrite(self, text: str, piece: StreamText) -> str:
        if not text or self._judged_elsewhere(piece):
            return text
        written = self._channels.setdefault(piece.channel, _Written())
        context = written.context
        result = self._judge(context + text, written, changeable=not piece.signed and not piece.arguments, counted=piece.repeat)
        written.context = (context + text)[-CONTEXT_CHARS:]  # the rest of a finding must still match
        written.length += len(text)
        return result[len(context) :]

    def _judge(self, text: str, written: _Written, changeable: bool, counted: bool = False) -> str:
        """``text`` is ``written.context`` (gone out already) and a new piece: only
        findings reaching past the context count, and only the piece can still change.
        A finding that grows across pieces is one finding: counted once, and its later
        parts removed without another marker. ``counted``: the text repeats what was
        judged already, so its findings are not counted again."""
        released, origin = len(written.context), written.length - len(written.context)
        if "![" in text:
            written.image_labels |= output.image_labels(text)
        findings = [f for f in output.inspect(text, self._actions, self._canaries, self._hosts, written.image_labels) if f.end > released]
        if not findings:
            return text
        new = [f for f in findings if (f.kind, origin + f.start) not in written.seen]
        if not counted:
            count_findings(self._audit, new)
        written.seen.update((finding.kind, origin + finding.start) for finding in new)
        for finding in new:
            if self._actions.get(finding.kind) == "withhold":
                raise withheld(finding.kind)
        if not changeable:
            return text
        clamped = [output.Finding(f.kind, max(f.start, released), f.end) for f in findings]
        continued = {c for c, f in zip(clamped, findings, strict=True) if f not in new and f.start < released}
        return output.apply(text, clamped, self._actions, continued)


def inspect_arguments(call: ToolCall, policy: IntegrityPolicy) -> list[output.Finding]:
    """The output guard's findings in a complete call's arguments, decoded: every
    string in them (and a call whose arguments are not JSON is denied anyway)."""
    canaries = policy.prompt.canaries if policy.prompt is not None else ()
    strings: list[str] = []
    read_strings(call.arguments, lambda _, text: strings.append(text) or text)
    return [finding for text in strings for finding in output.inspect(text, policy.output_actions, canaries, policy.allowed_hosts)]


def count_findings(audit_outcome: dict[str, Any], findings: Iterable[output.Finding]) -> None:
    """What the output checks found, by kind, in the request's outcome record."""
    counts = audit_outcome.setdefault("integrity", {}).setdefault("output", {})
    for finding in findings:
        counts[finding.kind] = counts.get(finding.kind, 0) + 1
