"""Policy unit tests the way ``opa test`` runs them: every ``test_*`` rule of the
given modules is evaluated with the given data and passes only when it is true.

A failing test is explained like ``opa test --explain=fails``: the first statement
of its body that no evaluation gets past, with the values of that statement's
operands. The explanation re-evaluates prefixes of the body as helper rules in the
test's own package, so names resolve exactly as they do in the test.

A test that raises a runtime error is an error, not a failure (``opa test``'s ERROR).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from portcullis.engine.policy_coverage import Coverage, coverage_of
from portcullis.engine.rego import Policy, PolicyError, Statement, TestRule

_HELPER = "__portcullis_explain"
_MAX_SHOWN = 3  # values of an operand across a body's solutions


Status = Literal["pass", "fail", "error"]


@dataclass(frozen=True)
class Bench:
    iterations: int
    ns_per_op: float


@dataclass(frozen=True)
class TestResult:
    path: str  # data.<package>.<name>
    file: str
    status: Status
    duration_ns: int
    prints: list[str]  # the test's print() output, each line "file:line: text"
    line: int = 0
    package: str = ""  # data.<package>, as opa test names it
    error: str | None = None  # the runtime error an erroring test raised
    explanation: list[str] = field(default_factory=list)  # why a failing test is not true
    bench: Bench | None = None

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def duration_us(self) -> int:
        return self.duration_ns // 1000

    @property
    def output(self) -> list[str]:
        """Prints, then the error or the explanation: all a reader needs, in order."""
        return [*self.prints, *([self.error] if self.error else []), *self.explanation]


@dataclass(frozen=True)
class TestRun:
    results: list[TestResult]
    coverage: Coverage | None = None  # of the policy modules, when asked for


def run_policy_tests(modules: Mapping[str, str], data: Mapping[str, Any]) -> list[TestResult]:
    return run_suite(modules, data).results


def run_suite(
    modules: Mapping[str, str],
    data: Mapping[str, Any],
    *,
    run: re.Pattern[str] | None = None,
    coverage_of_files: Collection[str] | None = None,
    bench_ns: int = 0,
) -> TestRun:
    """The tests whose path ``run`` finds (all without it), in file order. With
    ``coverage_of_files``, the line coverage of those modules by the tests that ran;
    with ``bench_ns``, each test is also timed over repeated runs for that long."""
    policy = Policy(modules, data, coverage=coverage_of_files is not None)
    rules = [rule for rule in sorted(policy.test_rules(), key=lambda r: (r.file, r.path)) if run is None or run.search(rule.path)]
    results = []
    for rule in rules:
        started = time.perf_counter_ns()
        passed, output, errored = policy.run_test(rule)
        duration = time.perf_counter_ns() - started
        # run_test appends the error after the prints; a false or undefined test says nothing of why
        prints, error = (output[:-1], output[-1]) if errored else (output, None)
        explanation = explain_failure(modules, data, rule) if not passed and not errored else []
        status: Status = "pass" if passed else "error" if errored else "fail"
        results.append(TestResult(rule.path, rule.file, status, duration, prints, rule.line, f"data.{rule.package}", error, explanation))
    measured = coverage_of(policy.coverage(coverage_of_files), coverage_of_files) if coverage_of_files is not None else None
    if bench_ns > 0:
        # on an engine of its own: recording coverage would slow every iteration
        timer = Policy(modules, data) if coverage_of_files is not None else policy
        benched = [timer.bench_test(rule, bench_ns) for rule in rules]
        results = [replace(result, bench=Bench(count, elapsed / count)) for result, (count, elapsed) in zip(results, benched, strict=True)]
    return TestRun(results, measured)


def explain_failure(modules: Mapping[str, str], data: Mapping[str, Any], rule: TestRule) -> list[str]:
    """Why ``rule`` is not true: per body, the statement evaluation stops at and its values."""
    lines: list[str] = []
    for number, body in enumerate(rule.bodies):
        if not body:
            continue
        helpers = _helper_module(rule, number, body)
        try:
            policy = Policy({**modules, f"{_HELPER}_{number}.rego": helpers}, data)
            stop = _first_unreached(policy, rule.package, number, len(body))
        except (PolicyError, TypeError, ValueError) as error:  # a test the helpers cannot mirror (rare shapes): say so, never crash
            lines.append(f"(no explanation: {error})")
            continue
        if stop is None:
            lines.append(f"{rule.file}:{body[-1].line}: every statement holds, yet the rule is not true (another definition or its value decides)")
            continue
        statement = body[stop]
        lines.append(f"{rule.file}:{statement.line}: {statement.text}")
        for index, operand in enumerate(statement.operands):
            try:
                values = sorted(policy.evaluate(f"data.{rule.package}.{_HELPER}_{number}_value_{index}_{stop}", {}) or ())
            except (PolicyError, TypeError, ValueError) as error:
                lines.append(f"  {operand}: (no value: {error})")
                continue
            rendered = _render(values)
            if rendered != operand:  # a literal explains nothing
                lines.append(f"  {operand} = {rendered}")
    return lines


def _helper_module(rule: TestRule, number: int, body: tuple[Statement, ...]) -> str:
    """Rules that hold when the body's first k statements hold, and the values the
    operands of each statement take after the statements before it."""
    parts = [f"package {rule.package}", *rule.imports]
    # print always succeeds; in the helpers it would only repeat the test's output on stdout
    body = tuple(Statement("true", s.line, (), "") if s.text.startswith("print(") else s for s in body)
    for k in range(1, len(body) + 1):
        prefix = "\n\t".join(statement.text for statement in body[:k])
        parts.append(f"{_HELPER}_{number}_reach_{k} if {{\n\t{prefix}\n}}")
    for k, statement in enumerate(body):
        before = [s.text for s in body[:k]]
        for index, operand in enumerate(statement.operands):
            binding = f"__portcullis_value := ({operand}) {statement.modifiers}".rstrip()
            query = "\n\t".join([*before, binding])
            # as JSON text: values may be sets of sets, which Python cannot hold in a set
            parts.append(f"{_HELPER}_{number}_value_{index}_{k} contains json.marshal(__portcullis_value) if {{\n\t{query}\n}}")
    return "\n\n".join(parts) + "\n"


def _first_unreached(policy: Policy, package: str, number: int, count: int) -> int | None:
    for k in range(1, count + 1):
        if policy.evaluate(f"data.{package}.{_HELPER}_{number}_reach_{k}", {}) is not True:
            return k - 1
    return None


def _render(values: list[str]) -> str:
    if not values:
        return "undefined"
    shown = [json.dumps(json.loads(value), sort_keys=True, ensure_ascii=False) for value in values[:_MAX_SHOWN]]
    shown = [text if len(text) <= 300 else text[:300] + "…" for text in shown]
    more = f" (and {len(values) - _MAX_SHOWN} more)" if len(values) > _MAX_SHOWN else ""
    return (shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)) + more
