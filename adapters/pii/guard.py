"""Stage 5's PII filter and stage 8's restore, as one gateway step.

Before dispatch: every string the provider would read is inspected on its surface
(system and chat text, tool descriptions, tool-call arguments, tool results), the
findings are judged against the team's merged policy, refused where it blocks,
and replaced where it transforms. The transformed body is serialised once and
that is what goes upstream: the raw-body fast path ends where a filter changed
something, so what is sent is exactly what was inspected.

After dispatch: placeholders the answer repeats are put back (``Restorer``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from portcullis.adapters.pii.detectors import Detector, DetectorFailed, PatternDetector
from portcullis.adapters.pii.restoring import Restorer
from portcullis.adapters.pii.vault import PSEUDONYM, TOKEN, MemoryVault, Vault, VaultUnavailable, scope_id
from portcullis.adapters.protocols.routes import PROTOCOLS
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.pii.policy import PiiPolicy, review
from portcullis.engine.pii.recognizers import Finding, resolve_overlaps
from portcullis.engine.pii.redaction import REVERSIBLE, rewrite

if TYPE_CHECKING:
    from portcullis.adapters.gateway import Exchange

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
    restore: dict[str, str] = field(default_factory=dict)  # placeholder -> value
    session_scope: str | None = None
    token_scope: str | None = None
    restored: int = 0


class PiiGuard:
    def __init__(self, vault: Vault, detectors: Mapping[str, Detector], settings: VaultSettings | None = None) -> None:
        self._vault = vault
        self._detectors: dict[str, Detector] = {"patterns": PatternDetector(), **detectors}
        self._settings = settings or VaultSettings()

    async def admit(self, exchange: Exchange) -> None:
        assert exchange.plan is not None and exchange.request is not None and exchange.principal is not None
        policy = exchange.plan.pii
        if policy is None:
            return
        try:
            await self._filter(exchange, policy)
        except (DetectorFailed, VaultUnavailable) as failure:
            reason = "vault" if isinstance(failure, VaultUnavailable) else "detector"
            log.warning("request %s: PII %s failed (%s); policy says %s", exchange.request_id, reason, type(failure).__name__, policy.on_error)
            exchange.audit_started["pii"] = {"policies": list(policy.policies), "error": reason, "failed_open": policy.on_error == "fail_open"}
            if policy.on_error != "fail_open":
                raise GatewayError(
                    ErrorKind.UNAVAILABLE, "the PII guard could not inspect this request, so it was not sent; try again later", code="pii_unavailable"
                ) from None

    async def settle(self, exchange: Exchange) -> None:
        state = exchange.pii
        if state is not None and state.restored:
            exchange.audit_outcome["pii"] = {"restored": state.restored}

    def close(self) -> None:
        for detector in self._detectors.values():
            close = getattr(detector, "close", None)
            if close is not None:
                close()

    def guard(self, exchange: Exchange, upstream: ModuleType) -> Restorer | None:
        state = exchange.pii
        if state is None or not state.policy.reversible:
            return None
        return Restorer(state, self._vault, upstream)

    # --- the filter ----------------------------------------------------------------------

    async def _filter(self, exchange: Exchange, policy: PiiPolicy) -> None:
        assert exchange.plan is not None and exchange.request is not None and exchange.principal is not None
        request = exchange.request
        protocol = PROTOCOLS[request.protocol]
        seen: list[tuple[str, str]] = []
        opaque = protocol.visit_prompt(request.body, lambda surface, text: seen.append((surface, text)) or text)
        texts = list(dict.fromkeys(text for _, text in seen if text))
        findings = await self._detect(texts, policy, exchange)
        judged = review(((surface, f) for surface, text in seen for f in findings.get(text, ())), opaque, policy)
        refusal = judged.refusal(policy)
        if refusal is not None:
            exchange.audit_started["pii"] = {"policies": list(policy.policies), "found": judged.found, "refused": refusal.code}
            raise refusal
        if judged.unsupported:  # the policy routes what it cannot cover to internal targets only
            internal = tuple(t for t in exchange.plan.targets if t.internal)
            if not internal:
                kinds = ", ".join(judged.unsupported)
                message = f"the request carries content this team's PII policy cannot inspect ({kinds}) and no approved internal target serves this model"
                raise GatewayError(ErrorKind.INVALID_REQUEST, message, code="pii_no_internal_target")
            exchange.plan = dataclasses.replace(exchange.plan, targets=internal)
        state = PiiState(policy)
        placeholders = await self._placeholders(exchange, policy, texts, findings, state)
        changed = False

        def transform(surface: str, text: str) -> str:
            nonlocal changed
            if surface not in policy.fields or not findings.get(text):
                return text
            result = rewrite(text, findings[text], policy.actions, placeholders)
            changed = changed or result is not text
            return result

        protocol.visit_prompt(request.body, transform)
        if changed:
            request.raw = json.dumps(request.body, ensure_ascii=False, separators=(",", ":")).encode()
        exchange.pii = state
        exchange.audit_started["pii"] = {
            "policies": list(policy.policies),
            "found": judged.found,
            "actions": judged.actions,
            **({"internal_only": list(judged.unsupported)} if judged.unsupported else {}),
            "session": state.session_scope is not None,
        }

    async def _detect(self, texts: list[str], policy: PiiPolicy, exchange: Exchange) -> dict[str, list[Finding]]:
        if not texts:
            return {}
        per_text: list[list[Finding]] = [[] for _ in texts]
        for name in policy.detectors:
            detector = self._detectors.get(name)
            if detector is None:
                raise DetectorFailed(f"the policy asks for the {name} detector, which this gateway has not enabled")
            results = await detector.detect(texts, policy.entities, exchange)
            for found, more in zip(per_text, results, strict=True):
                found.extend(f for f in more if f.entity in policy.actions and (f.detector == "patterns" or f.score >= policy.min_score))
        return {text: resolve_overlaps(found) for text, found in zip(texts, per_text, strict=True) if found}

    async def _placeholders(
        self, exchange: Exchange, policy: PiiPolicy, texts: list[str], findings: dict[str, list[Finding]], state: PiiState
    ) -> dict[tuple[str, str], str]:
        """Placeholders for every value a reversible action replaces, numbered in order
        of first appearance; from the session's vault scope when the client names its
        session, else from a scope that lives only as long as the request."""
        assert exchange.principal is not None and exchange.request is not None
        wanted: dict[str, dict[tuple[str, str], None]] = {PSEUDONYM: {}, TOKEN: {}}
        for text in texts:
            for finding in findings.get(text, ()):
                action = policy.actions[finding.entity]
                if action in REVERSIBLE:
                    wanted[PSEUDONYM if action == "pseudonymize" else TOKEN][(finding.entity, text[finding.start : finding.end])] = None
        principal = exchange.principal
        placeholders: dict[tuple[str, str], str] = {}
        session = exchange.request.session
        if session is not None:
            state.session_scope = scope_id("session", principal.team, principal.user or principal.key_id, session)
        if policy.reversible:
            state.token_scope = scope_id("tokens", principal.team)
        if wanted[PSEUDONYM]:
            items = list(wanted[PSEUDONYM])
            vault, scope = (self._vault, state.session_scope) if state.session_scope else (MemoryVault(), "request")
            placeholders.update(zip(items, await vault.assign(scope, PSEUDONYM, items, self._settings.session_ttl_seconds), strict=True))
        if wanted[TOKEN]:
            items = list(wanted[TOKEN])
            assert state.token_scope is not None
            placeholders.update(zip(items, await self._vault.assign(state.token_scope, TOKEN, items, self._settings.token_ttl_seconds), strict=True))
        state.restore = {placeholder: value for (_, value), placeholder in placeholders.items()}
        return placeholders
