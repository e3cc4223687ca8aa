"""Stage 5's prompt-integrity filter and stage 8's answer guards, as one gateway step.

Before dispatch (the decision has already refused a request that offers a tool the
team may not use: a mandatory policy is never silently rewritten), in this order:
user text, tool definitions and tool results are scanned by the bundle's injection
rules (warn: a response header and the audit record; block: a 400); tool results and
documents are wrapped in untrusted boundaries; the policy prompt goes in front of the
client's instructions.
The step edits the outbound body and says so (the pipeline serialises it once), so
what goes upstream is what was inspected, and governance (the next step) sizes and
charges it, policy prompt included.

It runs after the PII filter: the scanner reads what will actually be sent, and the
operator's prompt (with its canary) is never mistaken for the client's data.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.integrity.answers import OutputGuard, ToolCallGuard, count_findings, inspect_arguments, withheld
from portcullis.adapters.integrity.scan_cache import ScanCache
from portcullis.adapters.offload import off_loop
from portcullis.adapters.operations import Operation
from portcullis.adapters.pipeline import Admission, Exchange, ResponseGuard, Step
from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.registry import PROTOCOLS, Route
from portcullis.engine.errors import ErrorKind, GatewayError, printable
from portcullis.engine.integrity import hop
from portcullis.engine.integrity.injection import HEADER, ScanResult, review
from portcullis.engine.integrity.policy import IntegrityPolicy
from portcullis.engine.integrity.spotlight import boundary_for
from portcullis.engine.rego import PolicyError

log = logging.getLogger("portcullis.integrity")


@dataclass
class IntegrityState:
    """What a request's filter leaves for dispatch: the boundary suffix its untrusted
    content is wrapped in (this gateway's, or an authentic previous hop's)."""

    boundary: str | None = None


class PromptIntegrity(Step[IntegrityState]):
    layer = "integrity"

    # A count sizes what inference will send: the policy prompt and spotlighting included.
    operations = frozenset({Operation.INFERENCE, Operation.COUNT_TOKENS})

    def __init__(
        self,
        spotlight_key: bytes | None = None,
        cache_entries: int = 10_000,
        hop_key: bytes | None = None,
        hop_providers: frozenset[str] = frozenset(),
    ) -> None:
        # Without a configured key boundaries are stable for this process only; replicas
        # that share one keep a session's prefix stable whichever of them serves it.
        self._spotlight_key = spotlight_key or os.urandom(32)
        self.cache = ScanCache(cache_entries)
        self._hop_key = hop_key
        self._hop_providers = hop_providers  # providers that are gateways sharing the hop key

    async def admit(self, exchange: Exchange) -> Admission[IntegrityState] | None:
        assert exchange.plan is not None
        policy = exchange.plan.integrity
        if policy is None:
            return None
        assert exchange.request is not None and exchange.principal is not None
        request = exchange.request
        protocol = PROTOCOLS[request.protocol]
        record: dict[str, Any] = {"policies": list(policy.policies)}
        exchange.audit_started["integrity"] = record
        claim = hop.read(self._hop_key, request.hop, int(time.time())) if self._hop_key and request.hop else None
        state = IntegrityState(claim.boundary if claim else None)
        if policy.scan_surfaces:
            await self._scan(exchange, protocol, policy, record, state.boundary)
        changed = False
        if policy.spotlight and state.boundary is None:  # an authentic previous hop has wrapped them already
            boundary = boundary_for(self._spotlight_key, _scope(exchange))
            record["spotlighted"] = protocol.surfaces.spotlight(request.body, boundary, policy.spotlight)
            state.boundary = boundary.suffix if record["spotlighted"] else None
            changed = record["spotlighted"] > 0
        if policy.prompt is not None:
            prompt = policy.prompt
            record["policy_prompt"] = {"version": prompt.version, "sha256": prompt.sha256, "tokens": prompt.tokens}
            if claim is not None and claim.prompt_sha256 == prompt.sha256 and protocol.surfaces.leading_instructions(request.body) == prompt.text:
                record["policy_prompt"]["inserted_by"] = "gateway_hop"
            else:
                protocol.surfaces.insert_system_prompt(request.body, prompt.text)
                changed = True
        return Admission(state, body_changed=changed)

    def guards(self, exchange: Exchange, state: IntegrityState, pair: Route) -> list[ResponseGuard]:
        assert exchange.plan is not None and exchange.plan.integrity is not None  # admitted: the plan names a policy
        policy = exchange.plan.integrity
        guards: list[ResponseGuard] = []
        if policy.guards_tool_calls or policy.guards_output:  # a call's arguments are output too
            judge = self._tool_judge(exchange, policy)
            guards.append(ToolCallGuard(pair.upstream, lambda call: judge(pair.client_call(call))))
        if policy.guards_output:
            guards.append(OutputGuard(pair.upstream, policy, exchange.audit_outcome))
        return guards

    def outbound_headers(self, exchange: Exchange, state: IntegrityState, provider: str) -> dict[str, str]:
        """Signed word to a next gateway: the policy prompt in front, and the boundaries."""
        policy = exchange.plan.integrity if exchange.plan is not None else None
        if self._hop_key is None or provider not in self._hop_providers or policy is None or policy.prompt is None:
            return {}
        return {hop.HEADER: hop.sign(self._hop_key, policy.prompt.sha256, state.boundary, int(time.time()))}

    # --- layer C ---------------------------------------------------------------------------

    async def _scan(self, exchange: Exchange, protocol: WireProtocol, policy: IntegrityPolicy, record: dict[str, Any], hop_boundary: str | None) -> None:
        assert exchange.request is not None and exchange.bundle is not None
        seen: list[tuple[str, str]] = []
        protocol.surfaces.visit_prompt(exchange.request.body, lambda surface, text: seen.append((surface, text)) or text)
        scoped = [(surface, text) for surface, text in seen if surface in policy.scan_surfaces and text.strip()]
        if hop_boundary is not None:  # the previous gateway's own tags are not the content's
            tags = re.compile(rf"</?untrusted-{hop_boundary}[^>\n]*>")
            scoped = [(surface, tags.sub("", text)) for surface, text in scoped]
        scope, version = _scope(exchange, session_only=False), exchange.bundle.digest
        results: dict[str, ScanResult] = {}
        missing: dict[str, bytes] = {}
        for _, text in scoped:
            if text in results or text in missing:
                continue
            key = self.cache.key(scope, version, text)
            cached = self.cache.get(key)
            if cached is None:
                missing[text] = key
            else:
                results[text] = cached
        if missing:
            try:
                fresh = await off_loop(sum(map(len, missing)), exchange.bundle.scan_injections, list(missing))  # compiled set, no regorus
            except PolicyError as error:  # a scanner that cannot run refuses; it never waves a request through
                log.error("request %s: injection scan failed: %s", exchange.request_id, error)
                raise GatewayError(ErrorKind.INTERNAL, "the gateway's injection scanner could not check this request", code="policy_error") from None
            for (text, key), result in zip(missing.items(), fresh, strict=True):
                self.cache.put(key, result)
                results[text] = result
        judged = review(((surface, results[text]) for surface, text in scoped), policy.scan_surfaces, policy.thresholds)
        record["scanned"] = {"texts": len(results), "cached": len(results) - len(missing)}
        if judged.action is None:
            return
        record["injection"] = {"action": judged.action, "findings": {surface: list(rules) for surface, rules in judged.findings.items()}}
        log.warning("request %s: possible prompt injection (%s), action %s", exchange.request_id, judged.describe(), judged.action)
        if judged.action == "block":
            raise judged.refusal()
        exchange.headers[HEADER] = judged.describe()

    # --- layer D ---------------------------------------------------------------------------

    def _tool_judge(self, exchange: Exchange, policy: IntegrityPolicy) -> Any:
        """Verdicts from the bundle, one call at a time, then the output guard over the
        call's decoded arguments (withhold stops the answer, redact denies the call: a
        command cannot be half-run); denials are audited (the ``tool_call.denied`` event comes from that record). A
        verdict that cannot be reached denies."""
        assert exchange.request is not None and exchange.principal is not None and exchange.bundle is not None
        declared = exchange.request.tools
        principal, bundle = exchange.principal, exchange.bundle
        denied: list[dict[str, Any]] = []

        def verdict_of(call: Any) -> dict[str, Any]:
            if call.arguments is None:
                return {"allow": False, "rule": "unparseable_arguments", "message": "its arguments are not valid JSON, so they cannot be inspected"}
            if not policy.guards_tool_calls:
                return {"allow": True}
            try:
                return bundle.tool_call_verdicts(principal.as_input(), [{"name": call.name, "arguments": call.arguments}], declared)[0]
            except PolicyError as error:
                log.error("request %s: tool-call verdict failed: %s", exchange.request_id, error)
                return {"allow": False, "rule": "policy_error", "message": "the gateway's policy could not check it"}

        def output_verdict(call: Any) -> dict[str, Any]:
            findings = inspect_arguments(call, policy) if policy.guards_output else []
            if not findings:
                return {"allow": True}
            count_findings(exchange.audit_outcome, findings)
            actions = {finding.kind: policy.output_actions[finding.kind] for finding in findings}
            for kind, action in sorted(actions.items()):
                if action == "withhold":
                    raise withheld(kind)
            redacted = sorted(kind for kind, action in actions.items() if action == "redact")
            if redacted:
                return {"allow": False, "rule": f"output_{redacted[0]}", "message": f"its arguments carry {' and '.join(redacted)} the output policy removes"}
            return {"allow": True}

        def judge(call: Any) -> str | None:
            verdict = verdict_of(call)
            if verdict["allow"]:
                verdict = output_verdict(call)
            if verdict["allow"]:
                return None
            reason, rule = verdict["message"], verdict["rule"]
            denied.append({"tool": printable(call.name)[:64], "rule": rule})
            exchange.audit_outcome.setdefault("integrity", {})["tool_calls_denied"] = denied
            log.warning("request %s: tool call denied by rule %s", exchange.request_id, rule)
            return str(reason)

        return judge


def _scope(exchange: Exchange, session_only: bool = True) -> str:
    """Team, principal and session: what a boundary and a scan result may be shared by.
    Without a session, a boundary is the request's own; scan results the principal's."""
    assert exchange.principal is not None and exchange.request is not None
    principal = exchange.principal
    holder = f"user:{principal.user}" if principal.user else f"key:{principal.key_id}"
    session = exchange.request.session
    if session is None:
        return f"request:{exchange.request_id}" if session_only else f"{principal.team}|{holder}|-"
    return f"{principal.team}|{holder}|session:{session}"
