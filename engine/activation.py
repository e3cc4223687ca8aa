"""Turning a parsed bundle into one that may serve traffic.

A bundle becomes active only after every check passes, in this order: its data
matches the schema, its catalog is consistent with itself, the configured providers
and the price table, its own ``*_test.rego`` tests pass, and its entry point returns
well-formed plans. Anything else raises ``BundleError`` and the caller keeps serving
the bundle it already has.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Collection, Mapping
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any

import re2

from portcullis.engine import schemas
from portcullis.engine.budget_tiers import budget_reads, budget_tier_problems
from portcullis.engine.bundle import Bundle, BundleError, merge_data
from portcullis.engine.catalog import catalog_problems
from portcullis.engine.context_fit import Screen
from portcullis.engine.endpoint_policy import DEFAULT_POLICY, EndpointPolicy
from portcullis.engine.integrity.injection import ScanResult
from portcullis.engine.integrity.policy import integrity_problems
from portcullis.engine.integrity.scanner import Scanner, ScannerError, normalise, rules_read
from portcullis.engine.intent_routers import intent_problems
from portcullis.engine.pii.policy import detector_problems
from portcullis.engine.plan import DecisionPlan, Target
from portcullis.engine.portable import portability_problems, rule_path_problems
from portcullis.engine.pricing import Price, PriceTable
from portcullis.engine.rego import Policy, PolicyError
from portcullis.engine.suggestions import closest_names

DECISION_RULE = "data.portcullis.decision"
VISIBLE_MODELS_RULE = "data.portcullis.visible_models"
INJECTION_SCAN_RULE = "data.portcullis.injection_scan"
TOOL_CALL_RULE = "data.portcullis.tool_call_verdicts"
CONTEXT_FIT_RULE = "data.portcullis.context_fit_verdicts"
INDEX_RULE = "data.portcullis.compiled_index"
PLAN_SAMPLES = 200


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
    needs another could not be enforced, so its bundle is refused."""
    data = bundle.data.get("portcullis")
    if not isinstance(data, dict):
        raise BundleError("bundle has no data under data.portcullis (tenants and catalog)")
    # What OPA and regorus would read differently is refused first, naming the field,
    # so the bundle means in production what it means in review.
    unportable = portability_problems(data)
    if unportable:
        raise BundleError("; ".join(unportable))
    try:
        schemas.check("bundle-data", data, where="data.portcullis")
        prices = PriceTable(data["catalog"]["prices"])
    except Exception as error:
        raise BundleError(str(error)) from None
    problems = catalog_problems(data["catalog"], providers, prices, today)
    if detectors is not None:
        problems += detector_problems(data.get("pii"), data["catalog"], detectors)
    problems += integrity_problems(data.get("integrity"))
    problems += intent_problems(data.get("intent"), data["catalog"], list(data["tenants"]["teams"]))
    problems += budget_tier_problems(data)
    if problems:
        raise BundleError("; ".join(problems))
    try:
        _check_patterns(data.get("integrity"))
        scanner = Scanner((data.get("integrity") or {}).get("injection_rules") or [])
        _run_own_tests(bundle)
        policy = Policy(bundle.modules, bundle.data)
        # the index's place counts as data: the gateway puts it there
        clashes = rule_path_problems(policy.rule_paths(), merge_data(bundle.data, {"portcullis": {"compiled": {}}}))
        if clashes:
            raise BundleError("; ".join(clashes))
        index = _as_data(policy.evaluate(INDEX_RULE, {}))
        fit_screen = Screen.from_index(index.get("context_fit")) if isinstance(index, dict) else None
        if index is not None:
            policy = Policy(bundle.modules, merge_data(bundle.data, {"portcullis": {"compiled": index}}))
        _check_plans(policy, data)
        _check_context_fit(policy)
    except PolicyError as error:
        raise BundleError(f"policy error: {error}") from None
    except ScannerError as error:
        raise BundleError(str(error)) from None
    endpoints = EndpointPolicy.from_data(data.get("endpoints"))
    return ActiveBundle(bundle=bundle, policy=policy, catalog=data["catalog"], prices=prices, scanner=scanner, endpoints=endpoints, fit_screen=fit_screen)


def _evaluate(policy: Policy, input_json: str, ids: tuple[Any, Any]) -> DecisionPlan:
    document = policy.evaluate_json(DECISION_RULE, input_json)
    if not isinstance(document, dict):
        raise PolicyError(f"{DECISION_RULE} is undefined for this request")
    try:
        return DecisionPlan.from_policy(document, {"user": ids[0], "key_id": ids[1]})
    except (KeyError, TypeError) as error:
        raise PolicyError(f"{DECISION_RULE} returned a malformed plan ({error})") from None


def _as_data(index: Any) -> Any:
    """The index as the JSON it becomes in any other Rego engine; a set in it would
    mean one thing in regorus and another in OPA, so it is refused here."""
    try:
        return json.loads(json.dumps(index))
    except TypeError as error:
        raise PolicyError(f"{INDEX_RULE} is not JSON data ({error})") from None


def _normalised_strings(value: Any) -> Any:
    if isinstance(value, str):
        return normalise(value)
    if isinstance(value, dict):
        return {key: _normalised_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalised_strings(item) for item in value]
    return value


_PATTERN_PROBE = {"probe.rego": "package probe\n\ncompiled := [regex.match(pattern, \"\") | some pattern in input.patterns]\n"}


def _check_patterns(integrity: Mapping[str, Any] | None) -> None:
    """Every rule pattern compiles in the evaluator that will run it: regorus refuses
    look-around, back-references and patterns that compile to over 100 KiB."""
    rules = [*((integrity or {}).get("injection_rules") or ()), *((integrity or {}).get("tool_rules") or ())]
    probe = Policy(_PATTERN_PROBE, {})
    for rule in rules:
        try:
            probe.evaluate("data.probe.compiled", {"patterns": [rule["pattern"]]})
        except PolicyError as error:
            raise BundleError(f"integrity rule {rule['id']!r}: its pattern does not compile ({error})") from None
        try:  # OPA's dialect is RE2's: syntax only regorus knows (`(?x)`, `(?u)`) would fail there
            re2.compile(rule["pattern"])
        except re2.error:
            raise BundleError(f"integrity rule {rule['id']!r}: its pattern is not RE2 syntax, the dialect OPA reads") from None
    probe.release_thread()


_FIT_SAMPLE = {
    "targets": [{"index": 0, "context_window": 1000, "max_output_tokens": 100, "input_tokens": 10, "method": "estimate"}],
    "output_tokens": None,
    "reasoning_tokens": None,
    "reasoning_effort": None,
}


def _check_context_fit(policy: Policy) -> None:
    """The context-fit entry point answers one verdict per target, so a bundle without
    it (or with a broken one) is refused here rather than refusing every request."""
    try:
        verdicts = policy.evaluate(CONTEXT_FIT_RULE, _FIT_SAMPLE)
    except PolicyError as error:
        raise PolicyError(f"{CONTEXT_FIT_RULE}: {error}") from None
    if not (isinstance(verdicts, list) and len(verdicts) == 1 and isinstance(verdicts[0], dict) and isinstance(verdicts[0].get("fits"), bool)):
        raise PolicyError(f"{CONTEXT_FIT_RULE} must return one verdict ({{fits, reasons, ...}}) per target")


def _run_own_tests(bundle: Bundle) -> None:
    if not bundle.tests:
        return
    policy = Policy({**bundle.modules, **bundle.tests}, bundle.data)
    failed = [rule.path for rule in policy.test_rules() if not policy.run_test(rule)[0]]
    if failed:
        raise BundleError(f"the bundle's own policy tests fail: {', '.join(failed)}")


def _check_plans(policy: Policy, data: Mapping[str, Any]) -> None:
    """The entry point must return a schema-valid plan for every team and model name
    (up to a sample), including ones it refuses, so a plan the adapters cannot read
    never reaches traffic."""
    teams = [*list(data["tenants"]["teams"]), "__unknown_team__"]
    names = list(data["catalog"]["models"]) + list(data["catalog"].get("aliases", {})) + ["__unknown_model__"]
    samples = [(teams[0], name) for name in names] + [(team, names[0]) for team in teams[1:]]
    for team, name in itertools.islice(samples, PLAN_SAMPLES):
        input_document = {
            "principal": {"team": team, "user": None, "key_id": "activation-check"},
            "request": {"protocol": "anthropic_messages", "model": name, "stream": False, "requires": []},
        }
        document = policy.evaluate(DECISION_RULE, input_document)
        try:
            schemas.check("decision-plan", document, where=DECISION_RULE)
        except schemas.SchemaError as error:
            raise PolicyError(f"{error} (team {team!r}, model {name!r})") from None
