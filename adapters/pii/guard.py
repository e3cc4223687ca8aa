"""Stage 5's PII filter and stage 8's restore, as one gateway step.

Before dispatch: every string the provider would read is inspected on its surface
(system and chat text, tool descriptions, tool-call arguments, tool results), the
findings are judged against the team's merged policy, refused where it blocks,
and replaced where it transforms. The step edits the outbound body and says so; the
pipeline serialises it once for every step, so the raw-body fast path ends where a
filter changed something and what is sent is exactly what was inspected.

When a layer fails, the policy's ``on_error`` decides: ``fail_closed`` refuses the
request; ``fail_open`` serves it with the layers that worked — the pattern layer
cannot fail, so its blocks and replacements always apply — and records what was
missing. A request too large for a layer is the client's to shorten (400).

After dispatch: placeholders the answer repeats are put back (``Restorer``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.adapters.operations import Operation
from portcullis.adapters.pii.detectors import Detector, DetectorFailed, PatternDetector
from portcullis.adapters.pii.restoring import Restorer
from portcullis.adapters.pii.vault import PSEUDONYM, TOKEN, MemoryVault, Vault, VaultUnavailable, scope_id
from portcullis.adapters.pipeline import Admission, Exchange, ResponseGuard, Step
from portcullis.adapters.protocols.registry import PROTOCOLS, Route
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pii.context import names_a_type
from portcullis.engine.pii.policy import OTHER, PiiPolicy, field_of, review
from portcullis.engine.pii.recognizers import ALL_ENTITIES, Finding, resolve_overlaps
from portcullis.engine.pii.redaction import REVERSIBLE, STRICTNESS, rewrite

log = logging.getLogger("portcullis.pii")


@dataclass(frozen=True)
class VaultSettings:
    session_ttl_seconds: int = 86_400
    token_ttl_seconds: int = 30 * 86_400


@dataclass
class PiiState:
    """What a request's filter leaves for its answer: the placeholders it assigned and
    where to look up any others."""

    policy: PiiPolicy
    restore: dict[str, str] = field(default_factory=dict, repr=False)  # placeholder -> value: never in a repr
    session_scope: str | None = None
    token_scope: str | None = None
    restored: int = 0


class PiiGuard(Step[PiiState]):
    layer = "pii"

    # A count's body leaves the gateway too: it is filtered the same way before it goes.
    operations = frozenset({Operation.INFERENCE, Operation.COUNT_TOKENS})

    def __init__(self, vault: Vault, detectors: Mapping[str, Detector], settings: VaultSettings | None = None) -> None:
        self._vault = vault
        self._detectors: dict[str, Detector] = {"patterns": PatternDetector(), **detectors}
        self._settings = settings or VaultSettings()

    async def admit(self, exchange: Exchange) -> Admission[PiiState] | None:
        assert exchange.plan is not None
        if exchange.plan.pii is None:
            return None
        return await self._filter(exchange, exchange.plan.pii)

    async def settle(self, exchange: Exchange, state: PiiState) -> None:
        if state.restored:
            exchange.audit_outcome["pii"] = {"restored": state.restored}

    def guards(self, exchange: Exchange, state: PiiState, pair: Route) -> list[ResponseGuard]:
        if not state.policy.reversible:
            return []
        return [Restorer(state, self._vault, pair.upstream)]

    def close(self) -> None:
        for detector in self._detectors.values():
            close = getattr(detector, "close", None)
            if close is not None:
                close()

    # --- the filter ----------------------------------------------------------------------

    async def _filter(self, exchange: Exchange, policy: PiiPolicy) -> Admission[PiiState]:
        assert exchange.plan is not None and exchange.request is not None
        request = exchange.request
        protocol = PROTOCOLS[request.protocol]
        seen: list[tuple[str, str]] = []
        opaque = protocol.surfaces.visit_prompt(request.body, lambda surface, text: seen.append((surface, text)) or text)
        # Each text once, in order; of equal texts, the one a JSON member's name labels is
        # read (the detectors then find what it names wherever the request repeats it).
        unique: dict[str, str] = {}
        for _, text in seen:
            if text and (text not in unique or (names_a_type(text) and not names_a_type(unique[text]))):
                unique[text] = text
        texts = list(unique.values())
        # The costly layers read prose, not the structure around it (keys, enums, ids).
        prose = {text for surface, text in seen if surface != OTHER or " " in text}
        record: dict[str, Any] = {"policies": list(policy.policies)}
        exchange.audit_started["pii"] = record
        findings = await self._detect(texts, prose, policy, exchange, record)
        judged = review(((surface, f) for surface, text in seen for f in findings.get(text, ())), opaque, policy)
        record["found"] = judged.found
        refusal = judged.refusal(policy)
        if refusal is not None:
            record["refused"] = refusal.code
            raise refusal
        internal = None
        if judged.unsupported:  # the policy routes what it cannot cover to internal targets only
            internal = tuple(t for t in exchange.targets if t.internal)
            if not internal:
                kinds = ", ".join(judged.unsupported)
                message = f"the request carries content this team's PII policy cannot inspect ({kinds}) and no approved internal target serves this model"
                raise GatewayError(ErrorKind.INVALID_REQUEST, message, code="pii_no_internal_target")
            record["internal_only"] = list(judged.unsupported)
        state = PiiState(policy)
        placeholders = await self._placeholders(exchange, policy, texts, findings, state, record)
        changed = False

        def transform(surface: str, text: str) -> str:
            nonlocal changed
            if field_of(surface) not in policy.fields or not findings.get(text):
                return text
            result = rewrite(text, findings[text], policy.actions, placeholders)
            changed = changed or result is not text
            return result

        if findings:  # nothing found: every text would stay as it is, so the body is not walked again
            protocol.surfaces.visit_prompt(request.body, transform)
        record["actions"] = judged.actions
        record["session"] = state.session_scope is not None
        return Admission(state, targets=internal, body_changed=changed)

    async def _detect(self, texts: list[str], prose: set[str], policy: PiiPolicy, exchange: Exchange, record: dict[str, Any]) -> dict[str, list[Finding]]:
        """Each layer's findings, merged; where findings overlap the one whose action is
        strictest wins (a number that is both a card and an RRN is the blocked RRN)."""
        if not texts:
            return {}
        found: dict[str, list[Finding]] = {text: [] for text in texts}
        for name in policy.detectors:
            detector = self._detectors.get(name)
            batch = texts if name == "patterns" else [text for text in texts if text in prose]
            if not batch:
                continue
            try:
                if detector is None:
                    raise DetectorFailed(f"the {name} detector is not enabled")
                results = await detector.detect(batch, policy.entities, exchange)
            except DetectorFailed as failure:
                self._degrade(exchange, policy, record, name, failure)
                continue
            for text, more in zip(batch, results, strict=True):
                found[text].extend(f for f in more if f.entity in policy.actions and (f.detector == "patterns" or f.score >= policy.min_score))
        rank = {entity: i for i, entity in enumerate(ALL_ENTITIES)}

        def priority(finding: Finding) -> tuple[int, int, int, float]:
            return (STRICTNESS[policy.actions[finding.entity]], rank.get(finding.entity, len(rank)), finding.start - finding.end, -finding.score)

        return {text: resolve_overlaps(findings, priority) for text, findings in found.items() if findings}

    def _degrade(self, exchange: Exchange, policy: PiiPolicy, record: dict[str, Any], layer: str, failure: Exception) -> None:
        """A layer failed: refuse (fail_closed), or go on without it and say so."""
        log.warning("request %s: PII %s layer failed (%s); on_error is %s", exchange.request_id, layer, type(failure).__name__, policy.on_error)
        if isinstance(failure, DetectorFailed) and failure.too_large:
            if policy.on_error != "fail_open":
                raise GatewayError(
                    ErrorKind.INVALID_REQUEST, f"the request's text is larger than this team's PII policy can inspect ({failure})", code="pii_too_large"
                )
        elif policy.on_error != "fail_open":
            message = "the PII guard could not inspect this request, so it was not sent; try again later"
            raise GatewayError(ErrorKind.UNAVAILABLE, message, code="pii_unavailable")
        record.setdefault("degraded", []).append(layer)

    async def _placeholders(
        self, exchange: Exchange, policy: PiiPolicy, texts: list[str], findings: dict[str, list[Finding]], state: PiiState, record: dict[str, Any]
    ) -> dict[tuple[str, str], str]:
        """Placeholders for every value a reversible action replaces, numbered in order
        of first appearance: pseudonyms from the session's vault scope when the client
        names its session, else from a scope that lives as long as the request; tokens
        from the team's."""
        assert exchange.principal is not None and exchange.request is not None
        wanted: dict[str, dict[tuple[str, str], None]] = {PSEUDONYM: {}, TOKEN: {}}
        for text in texts:
            for finding in findings.get(text, ()):
                action = policy.actions[finding.entity]
                if action in REVERSIBLE:
                    wanted[PSEUDONYM if action == "pseudonymize" else TOKEN][(finding.entity, text[finding.start : finding.end])] = None
        principal = exchange.principal
        # Users and keys are tagged apart, so a user named like a key id shares nothing with it.
        holder = f"user:{principal.user}" if principal.user else f"key:{principal.key_id}"
        if exchange.request.session is not None:
            state.session_scope = scope_id("session", principal.team, holder, exchange.request.session)
        if policy.reversible:
            state.token_scope = scope_id("tokens", principal.team)
        placeholders: dict[tuple[str, str], str] = {}
        request_scope = MemoryVault()
        for kind, ttl in ((PSEUDONYM, self._settings.session_ttl_seconds), (TOKEN, self._settings.token_ttl_seconds)):
            items = list(wanted[kind])
            if not items:
                continue
            scope = state.session_scope if kind == PSEUDONYM else state.token_scope
            try:
                assigned = await self._vault.assign(scope, kind, items, ttl) if scope else await request_scope.assign("request", kind, items, ttl)
            except VaultUnavailable as failure:
                self._degrade(exchange, policy, record, "vault", failure)
                state.session_scope = state.token_scope = None  # this request's own mapping only
                assigned = await request_scope.assign("request", kind, items, ttl)
            placeholders.update(zip(items, assigned, strict=True))
        state.restore = {placeholder: value for (_, value), placeholder in placeholders.items()}
        return placeholders
