"""The checks a bundle passes before it may serve, shared by activation (which stops
at the first problem, engine/activation.py) and ``portcullis policy check`` (which runs
them all, collecting every problem).

In order: the data is there, reads alike in OPA and regorus, matches the schema, and is
consistent with itself, the configured providers and the price table; the integrity
patterns compile in both engines; the Rego compiles; the bundle's own ``*_test.rego``
tests pass; no rule sits on a data path; the per-bundle index evaluates to JSON data;
the entry points return well-formed plans and context-fit verdicts. Bundle layout and
signatures are checked before, when the files are parsed (engine/bundle.py).

A problem names its check and, where one is known, its Rego file and line or its data
field. A check whose input another check refused is skipped, not run on bad input.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

import jsonschema
import re2

from portcullis.engine import schemas
from portcullis.engine.budget_tiers import budget_tier_problems
from portcullis.engine.bundle import Bundle, BundleError, merge_data
from portcullis.engine.catalog import catalog_problems
from portcullis.engine.context_fit import Screen
from portcullis.engine.integrity.policy import integrity_problems
from portcullis.engine.integrity.scanner import Scanner, ScannerError
from portcullis.engine.intent_routers import intent_problems
from portcullis.engine.pii.policy import detector_problems
from portcullis.engine.portable import portability_problems, rule_path_problems
from portcullis.engine.pricing import PriceTable
from portcullis.engine.rego import Policy, PolicyError, TestRule, error_location, parse_module
from portcullis.engine.suggestions import closest_names

DECISION_RULE = "data.portcullis.decision"
VISIBLE_MODELS_RULE = "data.portcullis.visible_models"
INJECTION_SCAN_RULE = "data.portcullis.injection_scan"
TOOL_CALL_RULE = "data.portcullis.tool_call_verdicts"
CONTEXT_FIT_RULE = "data.portcullis.context_fit_verdicts"
INDEX_RULE = "data.portcullis.compiled_index"
PLAN_SAMPLES = 200
# What the gateway evaluates: per request, and once per bundle (INDEX_RULE).
REQUEST_ENTRY_POINTS = (DECISION_RULE, VISIBLE_MODELS_RULE, INJECTION_SCAN_RULE, TOOL_CALL_RULE, CONTEXT_FIT_RULE)
ENTRY_POINTS = (*REQUEST_ENTRY_POINTS, INDEX_RULE)
# The checks, in the order they run (bundle layout and signature come before, when the
# files are parsed: engine/bundle.py).
CHECKS = (
    *("data", "portability", "schema", "catalog", "pii detectors", "integrity", "intent", "budget tiers", "patterns"),
    *("rego", "tests", "rule paths", "index", "plans", "context fit"),
)

_T = TypeVar("_T")


@dataclass(frozen=True)
class Problem:
    """One reason a bundle may not serve. ``file``/``line``: the Rego source a problem
    sits in, when known; ``data_path``: its field under data.portcullis, when known."""

    check: str
    message: str
    file: str | None = None
    line: int | None = None
    data_path: tuple[str | int, ...] | None = None
    hint: str = ""


@dataclass
class CheckRun:
    """What a run of the checks found. A stopping run (``collect`` False: activation's)
    raises ``BundleError`` at the first check with a problem, worded as it always was."""

    collect: bool
    problems: list[Problem] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not run
    _ran: list[str] = field(default_factory=list)

    @property
    def passed(self) -> list[str]:
        failed = {problem.check for problem in self.problems}
        return [check for check in self._ran if check not in failed]

    def report(self, check: str, problems: list[Problem], refusal: str | None = None) -> bool:
        """Record a check's outcome; True when it found nothing."""
        if check not in self._ran:
            self._ran.append(check)
        if not problems:
            return True
        if not self.collect:
            raise BundleError(refusal if refusal is not None else "; ".join(problem.message for problem in problems))
        self.problems.extend(problems)
        return False

    def skip(self, checks: Iterable[str], why: str) -> None:
        for check in checks:
            if check not in self._ran:
                self.skipped.setdefault(check, why)


class _EveryName(frozenset[str]):
    """The providers when none are known: every name is one of them."""

    def __contains__(self, name: object) -> bool:
        return True


def check_bundle(bundle: Bundle, providers: Collection[str] | None, today: dt.date, detectors: Collection[str] | None = None) -> CheckRun:
    """Every activation check ``activate`` runs, collecting every problem instead of
    stopping at the first; a check whose inputs another check refused is skipped.
    ``providers`` None: the configured providers are unknown, so no target's provider
    is judged (and no region a provider calls)."""
    run = CheckRun(collect=True)
    run_checks(bundle, _EveryName() if providers is None else providers, today, detectors, run)
    return run


class Checked(NamedTuple):
    """What the checks built on the way, for the bundle to serve with."""

    data: dict[str, Any]
    policy: Policy  # with the per-bundle index in its data
    prices: PriceTable
    scanner: Scanner | None
    fit_screen: Screen | None


def run_checks(bundle: Bundle, providers: Collection[str], today: dt.date, detectors: Collection[str] | None, run: CheckRun) -> Checked | None:
    """The checks in activation order; ``run`` decides whether a failure stops them.
    What they built when every check passed, else None."""
    data = bundle.data.get("portcullis")
    if not run.report("data", [] if isinstance(data, dict) else [Problem("data", "bundle has no data under data.portcullis (tenants and catalog)")]):
        data = None
    prices: PriceTable | None = None
    scanner: Scanner | None = None
    valid: Collection[str] = ()  # the sections of data.portcullis that match the schema
    schema_ok = False
    if data is not None:
        # What OPA and regorus would read differently is refused first, naming the field,
        # so the bundle means in production what it means in review.
        run.report("portability", [Problem("portability", message) for message in portability_problems(data)])
        problems, prices = _schema_problems(data)
        schema_ok = run.report("schema", problems, refusal=problems[0].message if problems else None)
        valid = _valid_sections(data, problems)
    else:
        run.skip(("portability", "schema"), "there is no data.portcullis")
    # Each consistency check reads only sections the schema passed; activation refuses
    # all they find at once, as one message.
    groups = _consistency_problems(data or {}, valid, providers, prices, today, detectors)
    refusal = "; ".join(problem.message for _, problems in groups for problem in problems or ())
    for check, problems in groups:
        if problems is None:
            unknown = check == "pii detectors" and detectors is None
            run.skip((check,), "the PII detectors the gateway runs are unknown" if unknown else "the data it reads does not match the schema")
        else:
            run.report(check, problems, refusal=refusal)
    if data is not None and ("integrity" in valid or "integrity" not in data):
        problems, scanner = _scanner(data.get("integrity"))
        run.report("patterns", problems, refusal=problems[0].message if problems else None)
    else:
        run.skip(("patterns",), "the data it reads does not match the schema")
    policy = _compiled(bundle, run)
    if policy is None:
        run.skip(("tests", "rule paths", "index", "plans", "context fit"), "the Rego modules do not compile")
        return None
    _run_own_tests(bundle, run)
    # the index's place counts as data: the gateway puts it there
    clashes = rule_path_problems(policy.rule_paths(), merge_data(bundle.data, {"portcullis": {"compiled": {}}}))
    run.report("rule paths", [Problem("rule paths", message) for message in clashes])
    if data is None or not schema_ok:
        run.skip(("index", "plans", "context fit"), "the data does not match the schema")
        return None
    indexed = _guarded(run, "index", lambda: _with_index(bundle, policy))
    if indexed is None:
        run.skip(("plans", "context fit"), "the per-bundle index does not evaluate")
        return None
    policy, fit_screen = indexed
    run.report("index", [])
    _guarded(run, "plans", lambda: _check_plans(policy, data), then_passed=True)
    _guarded(run, "context fit", lambda: _check_context_fit(policy), then_passed=True)
    return None if run.problems else Checked(data, policy, prices, scanner, fit_screen)


def _schema_problems(data: Mapping[str, Any]) -> tuple[list[Problem], PriceTable | None]:
    """Every violation of the bundle-data schema, the one ``schemas.check`` would name
    (the most relevant) first; and the price table, when the catalog is valid."""
    try:
        errors = sorted(schemas.validator("bundle-data").iter_errors(data), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    except Exception as error:
        return [Problem("schema", str(error))], None
    problems = []
    if errors:
        best = top = jsonschema.exceptions.best_match(errors)
        while top.parent is not None:  # best_match may pick an error inside another (anyOf)
            top = top.parent
        for error in [best, *(error for error in errors if error is not top)]:
            message = f"{schemas.field_path('data.portcullis', error.absolute_path)}: {error.message}"
            problems.append(Problem("schema", message, data_path=tuple(error.absolute_path), hint=_schema_hint(error)))
    if "catalog" not in _valid_sections(data, problems):
        return problems, None
    try:
        return problems, PriceTable(data["catalog"]["prices"])
    except Exception as error:
        return [*problems, Problem("schema", str(error), data_path=("catalog", "prices"))], None


def _schema_hint(error: jsonschema.ValidationError) -> str:
    instance, expected = error.instance, error.validator_value
    if error.validator == "required" and isinstance(instance, dict):
        return f"add {', '.join(repr(name) for name in expected if name not in instance)} to this entry"
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = list(error.schema.get("properties", {}))
        hints = []
        for key in (key for key in instance if key not in known):
            guess = closest_names(str(key), known, limit=1)
            hints.append(f"remove {key!r}" + (f" or rename it {guess[0]!r}" if guess else ""))
        return "; ".join(hints)
    if error.validator == "type":
        return f"make it {' or '.join(expected) if isinstance(expected, list) else expected}"
    if error.validator == "enum":
        return f"use one of: {', '.join(map(str, expected))}"
    return ""


def _valid_sections(data: Mapping[str, Any], problems: list[Problem]) -> set[str]:
    """The top-level sections no schema problem lies in (none, for one at the root)."""
    if any(not problem.data_path for problem in problems):
        return set()
    return {str(section) for section in data} - {str(problem.data_path[0]) for problem in problems if problem.data_path}


def _consistency_problems(
    data: Mapping[str, Any], valid: Collection[str], providers: Collection[str], prices: PriceTable | None, today: dt.date, detectors: Collection[str] | None
) -> list[tuple[str, list[Problem] | None]]:
    """Each consistency check's problems, None for one whose sections are not valid."""
    catalog = data.get("catalog") or {}
    checks: list[tuple[str, tuple[str, ...], Callable[[], list[str]]]] = [
        ("catalog", ("catalog",), lambda: catalog_problems(catalog, providers, prices, today) if prices is not None else []),
        ("pii detectors", ("pii", "catalog"), lambda: detector_problems(data.get("pii"), catalog, detectors or ())),
        ("integrity", ("integrity",), lambda: integrity_problems(data.get("integrity"))),
        ("intent", ("intent", "catalog", "tenants"), lambda: intent_problems(data.get("intent"), catalog, list(data["tenants"]["teams"]))),
        ("budget tiers", ("budget_tiers", "governance", "tenants", "catalog"), lambda: budget_tier_problems(data)),
    ]
    groups: list[tuple[str, list[Problem] | None]] = []
    for check, sections, problems in checks:
        # a section the data leaves out is valid (the schema says which are required)
        readable = bool(data) and all(section in valid or section not in data for section in sections)
        if check == "catalog" and prices is None:
            readable = False
        if check == "pii detectors" and detectors is None:  # the gateway's detectors are unknown
            readable = False
        groups.append((check, [Problem(check, message) for message in problems()] if readable else None))
    return groups


def _as_data(index: Any) -> Any:
    """The index as the JSON it becomes in any other Rego engine; a set in it would
    mean one thing in regorus and another in OPA, so it is refused here."""
    try:
        return json.loads(json.dumps(index))
    except TypeError as error:
        raise PolicyError(f"{INDEX_RULE} is not JSON data ({error})") from None


_PATTERN_PROBE = {"probe.rego": 'package probe\n\ncompiled := [regex.match(pattern, "") | some pattern in input.patterns]\n'}


def _scanner(integrity: Mapping[str, Any] | None) -> tuple[list[Problem], Scanner | None]:
    problems = _pattern_problems(integrity)
    if problems:
        return problems, None
    try:
        return [], Scanner((integrity or {}).get("injection_rules") or [])
    except ScannerError as error:
        return [Problem("patterns", str(error))], None


def _pattern_problems(integrity: Mapping[str, Any] | None) -> list[Problem]:
    """Every rule pattern compiles in the evaluator that will run it: regorus refuses
    look-around, back-references and patterns that compile to over 100 KiB."""
    probe = Policy(_PATTERN_PROBE, {})
    problems = []
    for kind in ("injection_rules", "tool_rules"):
        for index, rule in enumerate((integrity or {}).get(kind) or ()):
            where = ("integrity", kind, index, "pattern")
            try:
                probe.evaluate("data.probe.compiled", {"patterns": [rule["pattern"]]})
            except PolicyError as error:
                problems.append(Problem("patterns", f"integrity rule {rule['id']!r}: its pattern does not compile ({error})", data_path=where))
                continue
            try:  # OPA's dialect is RE2's: syntax only regorus knows (`(?x)`, `(?u)`) would fail there
                re2.compile(rule["pattern"])
            except re2.error:
                message = f"integrity rule {rule['id']!r}: its pattern is not RE2 syntax, the dialect OPA reads"
                problems.append(Problem("patterns", message, data_path=where))
    probe.release_thread()
    return problems


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


def _compiled(bundle: Bundle, run: CheckRun) -> Policy | None:
    if run.collect:  # each module on its own, so every syntax error is named, not only the first
        broken = _parse_problems("rego", bundle.modules)
        if broken:
            run.report("rego", broken)
            return None
    return _guarded(run, "rego", lambda: Policy(bundle.modules, bundle.data), then_passed=True)


def _run_own_tests(bundle: Bundle, run: CheckRun) -> None:
    broken = _parse_problems("tests", bundle.tests) if run.collect else []
    failing = [] if broken else _guarded(run, "tests", lambda: _own_test_failures(bundle))
    if failing is not None:
        run.report(
            "tests",
            broken or [Problem("tests", f"the bundle's own policy test {rule.path} fails", rule.file, rule.line) for rule in failing],
            refusal=f"the bundle's own policy tests fail: {', '.join(rule.path for rule in failing)}",
        )


def _own_test_failures(bundle: Bundle) -> list[TestRule]:
    if not bundle.tests:
        return []
    policy = Policy({**bundle.modules, **bundle.tests}, bundle.data)
    return [rule for rule in policy.test_rules() if not policy.run_test(rule)[0]]


def _parse_problems(check: str, modules: Mapping[str, str]) -> list[Problem]:
    problems = []
    for name, source in modules.items():
        try:
            parse_module(name, source)
        except PolicyError as error:
            problems.append(replace(_policy_problem(check, error), message=f"syntax error: {error}"))
    return problems


def _with_index(bundle: Bundle, policy: Policy) -> tuple[Policy, Screen | None]:
    index = _as_data(policy.evaluate(INDEX_RULE, {}))
    fit_screen = Screen.from_index(index.get("context_fit")) if isinstance(index, dict) else None
    if index is not None:
        policy = Policy(bundle.modules, merge_data(bundle.data, {"portcullis": {"compiled": index}}))
    return policy, fit_screen


def _guarded(run: CheckRun, check: str, action: Callable[[], _T], then_passed: bool = False) -> _T | None:
    """``action``'s value; a ``PolicyError`` it raises is the check's problem (and None)."""
    try:
        value = action()
    except PolicyError as error:
        run.report(check, [_policy_problem(check, error)])
        return None
    if then_passed:
        run.report(check, [])
    return value


def _policy_problem(check: str, error: PolicyError) -> Problem:
    where = error_location(str(error))
    return Problem(check, f"policy error: {error}", where[0] if where else None, where[1] if where else None)


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
