"""Turning a parsed bundle into one that may serve traffic.

A bundle becomes active only after every check passes, in this order: its data
matches the schema, its catalog is consistent with itself, the configured providers
and the price table, its own ``*_test.rego`` tests pass, and its entry point returns
well-formed plans. Anything else raises ``BundleError`` and the caller keeps serving
the bundle it already has.

The checks themselves live in engine/activation_checks.py, which ``portcullis policy
check`` runs too, to the end rather than to the first problem.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Mapping
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any

from portcullis.engine.activation_checks import (  # the rule names are the gateway's too: re-exported here
    CONTEXT_FIT_RULE,
    DECISION_RULE,
    ENTRY_POINTS,
    INDEX_RULE,
    INJECTION_SCAN_RULE,
    PLAN_SAMPLES,
    REQUEST_ENTRY_POINTS,
    TOOL_CALL_RULE,
    VISIBLE_MODELS_RULE,
    CheckRun,
    run_checks,
)
from portcullis.engine.budget_tiers import budget_reads
from portcullis.engine.bundle import Bundle
from portcullis.engine.context_fit import Screen
from portcullis.engine.endpoint_policy import DEFAULT_POLICY, EndpointPolicy
from portcullis.engine.integrity.injection import ScanResult
from portcullis.engine.integrity.scanner import Scanner, normalise, rules_read
from portcullis.engine.plan import DecisionPlan, Target
from portcullis.engine.pricing import Price, PriceTable
from portcullis.engine.rego import Policy, PolicyError
from portcullis.engine.suggestions import closest_names

__all__ = [
    "CONTEXT_FIT_RULE",
    "DECISION_RULE",
    "ENTRY_POINTS",
    "INDEX_RULE",
    "INJECTION_SCAN_RULE",
    "PLAN_SAMPLES",
    "REQUEST_ENTRY_POINTS",
    "TOOL_CALL_RULE",
    "VISIBLE_MODELS_RULE",
    "ActiveBundle",
    "activate",
]

DECISION_CACHE_SIZE = 8192


class ActiveBundle:
    def __init__(
        self,
        bundle: Bundle,
        policy: Policy,
        catalog: Mapping[str, Any],
        prices: PriceTable,
        scanner: Scanner | None = None,
        endpoints: EndpointPolicy = DEFAULT_POLICY,
        fit_screen: Screen | None = None,
    ) -> None:
        self.bundle = bundle
        self.fit_screen = fit_screen  # the context-fit shortcut the bundle allows (engine/context_fit.py)
        self.policy = policy
        self.catalog = catalog
        self.prices = prices
        self.scanner = scanner or Scanner([])
        self.endpoints = endpoints  # endpoint picking in self-hosted pools (routing layer L7)
        self.budget_reads = budget_reads(bundle.data.get("portcullis"))  # the counters L3's tiers read, per team
        # A decision is a pure function of its input and this bundle, so equal inputs
        # share one evaluation, unless a module reads the clock or randomness.
        self.caches_decisions = policy.deterministic
        # The cache holds the policy, not this object: a bound method here would make a
        # reference cycle, freed by the cyclic collector on whichever thread it runs —
        # and a regorus engine dropped off its own thread is leaked, not freed.
        evaluate = partial(_evaluate, policy)
        self._decide = lru_cache(maxsize=DECISION_CACHE_SIZE)(evaluate) if self.caches_decisions else evaluate

    @property
    def revision(self) -> str:
        return self.bundle.revision

    @property
    def digest(self) -> str:
        return self.bundle.digest

    def decide(self, input_document: Mapping[str, Any], encoded: str | None = None) -> DecisionPlan:
        """The decision plan for one request. A policy that returns no plan fails closed.
        ``encoded``: the document already as JSON (the caller's faster encoder), else
        encoded here; equal documents must encode alike (it keys the decision cache)."""
        principal = input_document.get("principal") or {}
        ids = (principal.get("user"), principal.get("key_id"))
        plan = self._decide(encoded if encoded is not None else json.dumps(input_document, separators=(",", ":")), ids)
        if plan.reasons and plan.reasons[0].get("code") == "unknown_model":
            requested = (input_document.get("request") or {}).get("model")
            if isinstance(requested, str):
                # context variants (`model[1m]`) only when the client asked for one: otherwise they repeat their model
                names = [name for name in self.served_names(principal) if "[" not in name or "[" in requested]
                plan = replace(plan, suggestions=tuple(closest_names(requested, names)))
        return plan

    def served_names(self, principal: Mapping[str, Any]) -> list[str]:
        """Every name this principal may request: its visible models and their aliases."""
        models = self.visible_models(principal)
        visible = set(models)
        return models + sorted(alias for alias, model in self.catalog.get("aliases", {}).items() if model in visible)

    def visible_models(self, principal: Mapping[str, Any]) -> list[str]:
        models = self.policy.evaluate(VISIBLE_MODELS_RULE, {"principal": principal})
        return list(models or [])

    def scan_injections(self, texts: list[str]) -> list[ScanResult]:
        """The bundle's injection rules over each text (layer C), on the compiled set."""
        return [self.scanner.scan(text) for text in texts]

    def scan_injections_in_rego(self, texts: list[str]) -> list[ScanResult]:
        """The same through the Rego reference rule, for checking the fast path."""
        results = self.policy.evaluate(INJECTION_SCAN_RULE, {"texts": [rules_read(text) for text in texts]})
        if not isinstance(results, list) or len(results) != len(texts):
            raise PolicyError(f"{INJECTION_SCAN_RULE} did not return one result per text")
        return [ScanResult.from_policy(result) for result in results]

    def tool_call_verdicts(self, principal: Mapping[str, Any], calls: list[dict[str, Any]], declared: list[str]) -> list[dict[str, Any]]:
        """Whether the team may receive each of the model's tool calls (layer D)."""
        verdicts = self.policy.evaluate(TOOL_CALL_RULE, self.tool_call_input(principal, calls, declared))
        if not isinstance(verdicts, list) or len(verdicts) != len(calls):
            raise PolicyError(f"{TOOL_CALL_RULE} did not return one verdict per call")
        return verdicts

    def context_fit(self, input_document: Mapping[str, Any]) -> Any:
        """The bundle's verdict on each sized target (routing layer L5, engine/context_fit.py)."""
        return self.policy.evaluate(CONTEXT_FIT_RULE, input_document)

    @staticmethod
    def tool_call_input(principal: Mapping[str, Any], calls: list[dict[str, Any]], declared: list[str]) -> dict[str, Any]:
        """The input document of the tool-call rule. Arguments reach it normalised as
        scanned texts are, so `\\s` / `\\S` mean the same in every Rego engine (regorus
        reads them as Unicode, OPA as ASCII)."""
        normalised = [{**call, "arguments": _normalised_strings(call.get("arguments"))} for call in calls]
        return {"principal": principal, "calls": normalised, "declared": declared}

    def aliases_of(self, model: str) -> list[str]:
        return sorted(alias for alias, target in self.catalog.get("aliases", {}).items() if target == model)

    def price_for(self, target: Target, on: dt.date) -> Price:
        price = self.prices.price_for(target.provider, target.model, target.region, on)
        if price is None:  # activation proved every route priced; a date before the first version is the only way here
            raise PolicyError(f"no price in effect for {target.provider}/{target.model} on {on}")
        return price

    def warm(self) -> None:
        """Build this thread's evaluator now rather than on the first request."""
        self.policy.evaluate(VISIBLE_MODELS_RULE, {"principal": {}})


def activate(bundle: Bundle, providers: Collection[str], today: dt.date, detectors: Collection[str] | None = None) -> ActiveBundle:
    """``detectors``, when given, are the PII detectors this gateway runs: a policy that
    needs another could not be enforced, so its bundle is refused. The first check that
    fails refuses the bundle (``BundleError``)."""
    checked = run_checks(bundle, providers, today, detectors, CheckRun(collect=False))
    assert checked is not None  # a stopping run raises before it could return without one
    endpoints = EndpointPolicy.from_data(checked.data.get("endpoints"))
    return ActiveBundle(
        bundle=bundle,
        policy=checked.policy,
        catalog=checked.data["catalog"],
        prices=checked.prices,
        scanner=checked.scanner,
        endpoints=endpoints,
        fit_screen=checked.fit_screen,
    )


def _evaluate(policy: Policy, input_json: str, ids: tuple[Any, Any]) -> DecisionPlan:
    document = policy.evaluate_json(DECISION_RULE, input_json)
    if not isinstance(document, dict):
        raise PolicyError(f"{DECISION_RULE} is undefined for this request")
    try:
        return DecisionPlan.from_policy(document, {"user": ids[0], "key_id": ids[1]}, input_json)
    except (KeyError, TypeError) as error:
        raise PolicyError(f"{DECISION_RULE} returned a malformed plan ({error})") from None


def _normalised_strings(value: Any) -> Any:
    if isinstance(value, str):
        return normalise(value)
    if isinstance(value, dict):
        return {key: _normalised_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalised_strings(item) for item in value]
    return value
