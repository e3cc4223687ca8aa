"""Policy unit tests the way ``opa test`` runs them: every ``test_*`` rule of the
given modules is evaluated with the given data and passes only when it is true."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.engine.rego import Policy


@dataclass(frozen=True)
class TestResult:
    path: str
    file: str
    passed: bool
    duration_us: int
    output: list[str]


def run_policy_tests(modules: Mapping[str, str], data: Mapping[str, Any]) -> list[TestResult]:
    policy = Policy(modules, data)
    results = []
    for rule in sorted(policy.test_rules(), key=lambda r: (r.file, r.path)):
        started = time.perf_counter_ns()
        passed, output = policy.run_test(rule)
        results.append(TestResult(rule.path, rule.file, passed, (time.perf_counter_ns() - started) // 1000, output))
    return results
