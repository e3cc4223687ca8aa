"""The bundle means in the gateway (regorus) what it means in review (OPA v1.20).

Each bundle variant (tests/rego_inputs.py) is activated as the gateway activates it,
then loaded into real OPA in-process (opa-golib-python-bindings, a dev-only
dependency that `make install-dev` installs); every entry point the gateway evaluates
must return the same value in both over generated inputs: the per-bundle index, the
decision plan, the visible models, the tool-call verdicts and the injection scan (and
the scan's RE2 fast path must agree with both).
"""

from __future__ import annotations

import datetime as dt
import platform
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from portcullis.engine.activation import (
    CONTEXT_FIT_RULE,
    DECISION_RULE,
    INDEX_RULE,
    INJECTION_SCAN_RULE,
    TOOL_CALL_RULE,
    VISIBLE_MODELS_RULE,
    ActiveBundle,
    activate,
)
from portcullis.engine.bundle import Bundle, read_bundle_files, split_sources
from portcullis.engine.integrity.injection import ScanResult
from portcullis.engine.integrity.scanner import normalise
from portcullis.engine.plan import DecisionPlan
from portcullis.engine.rego import Policy
from tests import rego_inputs

ROOT = Path(__file__).resolve().parent.parent
TODAY = dt.date(2026, 12, 1)
OPA_BINDINGS = "opa-golib-python-bindings==0.4.4"
DECISIONS_PER_VARIANT = 600
TOOL_CALL_INPUTS_PER_VARIANT = 150
PRINCIPALS_PER_VARIANT = 100
CONTEXT_FIT_INPUTS_PER_VARIANT = 40
TEXTS = 1500
VARIANTS = rego_inputs.variants(split_sources(read_bundle_files(ROOT / "policies"))[2]["portcullis"])
assert len(VARIANTS) * DECISIONS_PER_VARIANT >= 2000  # the brief of the comparison: at least 2,000 generated decisions


def _opa_engine_class() -> Any:
    try:
        from opa_bindings import OpaEngine
    except ImportError as error:
        # The bindings ship one wheel, for x86-64 Linux (glibc 2.34+); elsewhere the
        # import cannot work and the comparison is impossible, not merely missing.
        libc, version = platform.libc_ver()
        if sys.platform != "linux" or platform.machine() != "x86_64" or libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 34):
            pytest.skip(f"{OPA_BINDINGS} has no build for {sys.platform}/{platform.machine()} {libc} {version}: real OPA cannot run here")
        pytest.fail(f"real OPA is needed for this comparison and cannot be imported ({error}); `make install-dev` installs {OPA_BINDINGS}", pytrace=False)
    return OpaEngine


class OpaBundle:
    """The same modules and data in OPA, with the index computed by OPA itself."""

    def __init__(self, engine_class: Any, modules: dict[str, str], data: dict[str, Any], indexed: bool = True) -> None:
        self._engine = engine_class()
        for name, source in modules.items():
            self._engine.add_policy(name, source)
        self._engine.add_data(data)
        self.index = self.evaluate(INDEX_RULE, {}) if indexed else None
        if self.index is not None:
            self._engine.add_data({"portcullis": {"compiled": self.index}})

    def evaluate(self, rule: str, input_document: dict[str, Any]) -> Any:
        from opa_bindings import OpaUndefinedError

        try:
            return self._engine.eval_document(rule.removeprefix("data."), input_document)
        except OpaUndefinedError:
            return None

    def close(self) -> None:
        self._engine.close()


def shipped_bundle() -> tuple[dict[str, str], dict[str, Any]]:
    modules, _, data = split_sources(read_bundle_files(ROOT / "policies"))
    return modules, data


def activated(modules: dict[str, str], data: dict[str, Any]) -> ActiveBundle:
    bundle = Bundle(revision="differential", roots=("",), digest="-", modules=modules, tests={}, data=data, signed_by=None)
    return activate(bundle, providers={"mock"}, today=TODAY)


def as_plan(document: Any, input_document: dict[str, Any]) -> DecisionPlan:
    """The plan the gateway reads, with the index's `{user}` / `{key}` filled in."""
    principal = input_document["principal"]
    return DecisionPlan.from_policy(document, {"user": principal["user"], "key_id": principal["key_id"]})


class Differences:
    def __init__(self) -> None:
        self.found: list[tuple[str, Any, Any, Any]] = []
        self.compared = 0

    def check(self, entry: str, input_document: Any, regorus_value: Any, opa_value: Any) -> None:
        self.compared += 1
        if regorus_value != opa_value:
            self.found.append((entry, input_document, regorus_value, opa_value))

    def report(self) -> str:
        lines = [f"{len(self.found)} of {self.compared} evaluations differ"]
        for entry, input_document, regorus_value, opa_value in self.found[:3]:
            lines.append(f"{entry}\n  input: {input_document!r}")
            lines.extend(f"  at {path}: regorus {a!r}, opa {b!r}" for path, a, b in first_differences(regorus_value, opa_value))
        return "\n".join(lines)


def first_differences(a: Any, b: Any, path: str = "$", limit: int = 3) -> list[tuple[str, Any, Any]]:
    """Where two JSON values differ, deepest first found (a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b), key=str):
            found += first_differences(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}", limit)
        return found[:limit]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        found = []
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found += first_differences(x, y, f"{path}[{index}]", limit)
        return found[:limit]
    return [] if a == b else [(path, a, b)]


@pytest.fixture(scope="module")
def opa_engine_class() -> Any:
    return _opa_engine_class()


def _context_fit_inputs(seed: int, count: int = CONTEXT_FIT_INPUTS_PER_VARIANT) -> list[dict[str, Any]]:
    """Context-fit inputs around the edges: windows near the counts, every method, with
    and without an output cap, a declared budget or a named effort."""
    rng = random.Random(seed)
    inputs = []
    for _ in range(count):
        targets = [
            {
                "index": index,
                "context_window": rng.choice([1000, 4096, 200000]),
                "max_output_tokens": rng.choice([512, 4096]),
                "input_tokens": rng.choice([0, 500, 900, 3900, 150000]),
                "method": rng.choice(["exact", "estimate", "upper_bound"]),
            }
            for index in range(rng.randint(0, 3))
        ]
        effort = rng.choice([None, "low", "high", "unheard-of"])
        inputs.append(
            {
                "targets": targets,
                "output_tokens": rng.choice([None, 1, 100, 5000]),
                "reasoning_tokens": rng.choice([None, 256, 4096]),
                "reasoning_effort": effort,
            }
        )
    return inputs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_entry_point_agrees_with_opa(variant: str, opa_engine_class: Any) -> None:
    modules, shipped = shipped_bundle()
    data = {**shipped, "portcullis": VARIANTS[variant]}
    active = activated(modules, data)
    unindexed = Policy(modules, data)  # what policy tests and a bundle without its index evaluate
    opa = OpaBundle(opa_engine_class, modules, data)
    differences, unindexed_differences = Differences(), Differences()
    try:
        differences.check(INDEX_RULE, {}, unindexed.evaluate(INDEX_RULE, {}), opa.index)
        inputs = rego_inputs.Inputs(data["portcullis"], seed=sorted(VARIANTS).index(variant))
        for input_document in rego_inputs.generate(DECISIONS_PER_VARIANT, inputs.decision):
            plan = active.policy.evaluate(DECISION_RULE, input_document)
            differences.check(DECISION_RULE, input_document, plan, opa.evaluate(DECISION_RULE, input_document))
            without_index = unindexed.evaluate(DECISION_RULE, input_document)
            unindexed_differences.check(DECISION_RULE, input_document, as_plan(plan, input_document), as_plan(without_index, input_document))
        for _ in range(PRINCIPALS_PER_VARIANT):
            principal = inputs.principal()
            differences.check(VISIBLE_MODELS_RULE, principal, active.visible_models(principal), opa.evaluate(VISIBLE_MODELS_RULE, {"principal": principal}))
        for document in rego_inputs.generate(TOOL_CALL_INPUTS_PER_VARIANT, inputs.tool_calls):
            # the gateway's own input document (arguments normalised), compared raw: for a
            # team no integrity policy names the rule yields no verdicts, in both engines
            tool_input = active.tool_call_input(document["principal"], document["calls"], document["declared"])
            differences.check(TOOL_CALL_RULE, document, active.policy.evaluate(TOOL_CALL_RULE, tool_input), opa.evaluate(TOOL_CALL_RULE, tool_input))
        for fit_input in _context_fit_inputs(sorted(VARIANTS).index(variant)):
            in_regorus = active.policy.evaluate(CONTEXT_FIT_RULE, fit_input)
            differences.check(CONTEXT_FIT_RULE, fit_input, in_regorus, opa.evaluate(CONTEXT_FIT_RULE, fit_input))
            unindexed_differences.check(CONTEXT_FIT_RULE, fit_input, in_regorus, unindexed.evaluate(CONTEXT_FIT_RULE, fit_input))
    finally:
        opa.close()
        unindexed.release_thread()
    assert not differences.found, differences.report()
    assert not unindexed_differences.found, "the per-bundle index changes decisions: " + unindexed_differences.report()
    assert differences.compared == 1 + DECISIONS_PER_VARIANT + PRINCIPALS_PER_VARIANT + TOOL_CALL_INPUTS_PER_VARIANT + CONTEXT_FIT_INPUTS_PER_VARIANT


def test_injection_scan_agrees_with_opa_and_the_fast_path(opa_engine_class: Any) -> None:
    modules, data = shipped_bundle()
    data["portcullis"] = VARIANTS["combined"]
    active = activated(modules, data)
    opa = OpaBundle(opa_engine_class, modules, data)
    texts = rego_inputs.texts(random.Random(11), TEXTS)
    differences = Differences()
    hits = 0
    try:
        for start in range(0, len(texts), 25):
            batch = texts[start : start + 25]
            normalised = {"texts": [normalise(text) for text in batch]}
            in_regorus = active.policy.evaluate(INJECTION_SCAN_RULE, normalised)
            in_opa = opa.evaluate(INJECTION_SCAN_RULE, normalised)
            differences.check(INJECTION_SCAN_RULE, batch, in_regorus, in_opa)
            fast = active.scan_injections(batch)
            differences.check("RE2 fast path vs OPA", batch, fast, [ScanResult.from_policy(result) for result in in_opa or []])
            hits += sum(1 for result in fast if result.rules)
    finally:
        opa.close()
    assert not differences.found, differences.report()
    assert hits > TEXTS // 10, f"only {hits} of {TEXTS} generated texts match a rule: the comparison would say little"


def test_the_comparison_sees_what_activation_refuses(opa_engine_class: Any) -> None:
    """A bundle built around the constructs activation refuses, evaluated without the
    refusal: regorus and OPA disagree, so the comparison above can fail (and when a
    regorus release fixes these, this test says the restrictions may be relaxed)."""
    modules, data = shipped_bundle()
    portcullis = data["portcullis"]
    team = sorted(portcullis["tenants"]["teams"])[0]
    portcullis.setdefault("integrity", {}).setdefault("policies", {})["glob-by-character"] = {"teams": [team], "tools": {"allow": ["tool-?"]}}
    portcullis["integrity"].setdefault("injection_rules", []).append({"id": "ascii-boundary", "weight": 3, "pattern": r"\bid_rsa\b"})
    regorus_policy = Policy(modules, data)
    opa = OpaBundle(opa_engine_class, modules, data)
    principal = {"key_id": "key_0000000000000001", "team": team, "user": None}
    try:
        calls = {"principal": principal, "calls": [{"name": "tool-é", "arguments": {}}], "declared": ["tool-é"]}
        assert regorus_policy.evaluate(TOOL_CALL_RULE, calls)[0]["rule"] != opa.evaluate(TOOL_CALL_RULE, calls)[0]["rule"]
        scan = {"texts": ["cat éid_rsa"]}
        assert regorus_policy.evaluate(INJECTION_SCAN_RULE, scan) != opa.evaluate(INJECTION_SCAN_RULE, scan)
    finally:
        opa.close()
        regorus_policy.release_thread()


def test_the_policy_tests_pass_in_opa_too(opa_engine_class: Any) -> None:
    """`portcullis policy test policies policy-tests` in OPA: every test_* rule is true."""
    modules, data = shipped_bundle()
    tests = {path.relative_to(ROOT).as_posix(): path.read_text() for path in sorted((ROOT / "policy-tests").glob("*_test.rego"))}
    regorus_policy = Policy({**modules, **tests}, data)
    rules = regorus_policy.test_rules()
    regorus_policy.release_thread()
    opa = OpaBundle(opa_engine_class, {**modules, **tests}, data, indexed=False)  # as `policy test` runs them
    try:
        failing = [rule.path for rule in rules if opa.evaluate(rule.path, {}) is not True]
    finally:
        opa.close()
    assert len(rules) > 50
    assert not failing, f"policy tests that fail in OPA: {failing}"
