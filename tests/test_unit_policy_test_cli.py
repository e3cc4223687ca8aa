"""`portcullis policy test`'s opa-test flags: --run, --coverage and --threshold, --bench,
--format json and -v; an erroring test reported as ERROR apart from a failing one; a
failing test's explanation and print output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Lines regorus counts (expressions in bodies and in heads' values; `allow if {` has none):
# 4, 8, 9, 12 and 13.
ACCESS = """package access

allow if {
\tinput.role == "admin"
}

allow if {
\tinput.role == "reader"
\tinput.method == "GET"
}

reason := "admins only" if {
\tnot data.access.allow
}
"""
# No test reaches this module: all its lines (3 and 6) are not covered.
UNUSED = """package unused

limit := 3

over if {
\tinput.n > limit
}
"""
# Full references (data.access.allow), not an import alias: through an alias regorus
# evaluates every rule of the imported package, which would cover `reason` too.
ACCESS_TESTS = """package access_test

test_admin if {
\tdata.access.allow with input as {"role": "admin"}
}

test_reader_get if {
\tprint("reader may", "GET")
\tdata.access.allow with input as {"role": "reader", "method": "GET"}
}
"""
BROKEN_TESTS = """package broken_test

test_false if {
\tlimit := 3
\tprint("limit is", limit)
\tlimit > 5
}

test_error if {
\tto_number("not a number") == 1
}

test_fine if true
"""


@pytest.fixture
def suite(tmp_path: Path) -> tuple[Path, Path]:
    policy, tests = tmp_path / "policy", tmp_path / "tests"
    policy.mkdir()
    tests.mkdir()
    (policy / "access.rego").write_text(ACCESS)
    (policy / "unused.rego").write_text(UNUSED)
    (tests / "access_test.rego").write_text(ACCESS_TESTS)
    return policy, tests


def policy_test(*args: Any) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "test", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_run_keeps_only_the_tests_whose_path_matches(suite: tuple[Path, Path]) -> None:
    result = policy_test(*suite, "-v", "--run", r"access_test\.test_admin$")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "data.access_test.test_admin: PASS" in result.stdout and "test_reader_get" not in result.stdout
    assert "PASS: 1/1" in result.stdout
    none = policy_test(*suite, "--run", "no_such_test")
    assert none.returncode == 1 and "no tests in" in none.stderr and "match --run 'no_such_test'" in none.stderr
    bad = policy_test(*suite, "--run", "(")
    assert bad.returncode == 1 and "is not a regular expression" in bad.stderr and "Traceback" not in bad.stderr


def test_coverage_counts_the_policy_modules_lines_not_the_tests(suite: tuple[Path, Path]) -> None:
    policy, _ = suite
    result = policy_test(*suite, "--coverage")
    assert result.returncode == 0, result.stdout + result.stderr
    # access: 4, 8, 9 reached; 12-13 (reason) not: 3/5. unused: 0/2. Total 3/7.
    assert f"{policy}/access.rego 60% (not covered: 12-13)" in result.stdout
    assert f"{policy}/unused.rego 0% (not covered: 3, 6)" in result.stdout
    assert "coverage: 42.86% (3/7 lines)" in result.stdout
    assert "access_test.rego 100%" not in result.stdout and "access_test.rego 0%" not in result.stdout
    admin_only = policy_test(*suite, "--coverage", "--run", "test_admin")  # line 9 is never reached
    assert f"{policy}/access.rego 40% (not covered: 9, 12-13)" in admin_only.stdout
    assert "coverage: 28.57% (2/7 lines)" in admin_only.stdout


def test_threshold_fails_below_and_passes_at_or_above(suite: tuple[Path, Path]) -> None:
    below = policy_test(*suite, "--threshold", "50")
    assert below.returncode == 2, below.stdout + below.stderr  # opa test's code: tests pass, coverage does not
    assert "Code coverage threshold not met: got 42.86 instead of 50.00" in below.stderr
    assert f"{suite[0]}/access.rego:12-13" in below.stderr
    assert "coverage: 42.86%" in below.stdout  # --threshold implies --coverage
    above = policy_test(*suite, "--threshold", "42.5")
    assert above.returncode == 0 and "threshold not met" not in above.stderr
    refused = policy_test(*suite, "--threshold", "101")
    assert refused.returncode == 2 and "is not a percentage from 0 to 100" in refused.stderr


def test_json_is_one_document_of_every_result_and_the_coverage(suite: tuple[Path, Path]) -> None:
    policy, tests = suite
    (tests / "broken_test.rego").write_text(BROKEN_TESTS)
    result = policy_test(*suite, "--format", "json", "--coverage")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["summary"] == {"total": 5, "pass": 3, "fail": 1, "error": 1}
    by_name = {test["name"]: test for test in document["tests"]}
    assert set(by_name) == {"test_admin", "test_reader_get", "test_false", "test_error", "test_fine"}
    reader = by_name["test_reader_get"]
    assert reader["package"] == "data.access_test" and reader["path"] == "data.access_test.test_reader_get"
    assert reader["file"] == f"{tests}/access_test.rego" and reader["line"] == 7
    assert reader["passed"] is True and reader["failed"] is False and reader["error"] is None
    assert isinstance(reader["duration"], int) and reader["duration"] > 0
    assert reader["output"] == [f"{tests}/access_test.rego:8: reader may GET"]
    false = by_name["test_false"]
    assert false["status"] == "fail" and false["failed"] is True and false["error"] is None
    assert false["explanation"] == [f"{tests}/broken_test.rego:6: limit > 5", "  limit = 3"]
    error = by_name["test_error"]
    assert error["status"] == "error" and error["failed"] is False and "could not parse string as number" in error["error"]
    coverage = document["coverage"]
    assert coverage["coverage"] == 42.86 and coverage["covered_lines"] == 3 and coverage["not_covered_lines"] == 4
    access = coverage["files"][f"{policy}/access.rego"]
    assert access["lines"] == {"covered": [4, 8, 9], "not_covered": [12, 13]} and access["coverage"] == 60.0
    assert access["not_covered"] == [{"start": {"row": 12}, "end": {"row": 13}}]
    assert set(coverage["files"]) == {f"{policy}/access.rego", f"{policy}/unused.rego"}


def test_an_erroring_test_is_an_error_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "broken_test.rego").write_text(BROKEN_TESTS)
    result = policy_test(tmp_path, "--run", "test_error|test_fine")
    assert result.returncode == 1
    assert "data.broken_test.test_error: ERROR (" in result.stdout and f"at {tmp_path}/broken_test.rego:9" in result.stdout
    assert "could not parse string as number" in result.stdout and f"{tmp_path}/broken_test.rego:10:" in result.stdout
    assert "PASS: 1/2\nERROR: 1/2" in result.stdout and "FAIL" not in result.stdout
    both = policy_test(tmp_path)
    assert both.returncode == 1 and "PASS: 1/3\nFAIL: 1/3\nERROR: 1/3" in both.stdout


def test_a_failing_test_says_where_why_and_what_it_printed(tmp_path: Path) -> None:
    (tmp_path / "broken_test.rego").write_text(BROKEN_TESTS)
    result = policy_test(tmp_path, "--run", "test_false")
    assert result.returncode == 1
    out = result.stdout
    assert "data.broken_test.test_false: FAIL (" in out and f"at {tmp_path}/broken_test.rego:3" in out
    assert f"print output:\n      {tmp_path}/broken_test.rego:5: limit is 3" in out
    assert f"fails at:\n      {tmp_path}/broken_test.rego:6: limit > 5\n        limit = 3" in out


def test_verbose_shows_passing_tests_and_their_prints(suite: tuple[Path, Path]) -> None:
    _, tests = suite
    quiet = policy_test(*suite)
    assert quiet.returncode == 0 and "test_reader_get" not in quiet.stdout and "reader may" not in quiet.stdout
    verbose = policy_test(*suite, "-v")
    assert "data.access_test.test_reader_get: PASS (" in verbose.stdout
    assert f"print output:\n      {tests}/access_test.rego:8: reader may GET" in verbose.stdout


def test_bench_times_every_test(suite: tuple[Path, Path]) -> None:
    result = policy_test(*suite, "--bench", "--bench-time", "0.05")
    assert result.returncode == 0, result.stdout + result.stderr
    timings = re.findall(r"data\.access_test\.(test_\w+): PASS \((\d+) iterations, (\d+) ns/op, ([\d.]+) µs/op\)", result.stdout)
    assert {name for name, *_ in timings} == {"test_admin", "test_reader_get"}
    assert all(int(iterations) > 1 and int(ns) > 0 for _, iterations, ns, _ in timings)
    document = json.loads(policy_test(*suite, "--bench", "--bench-time", "0.05", "--format", "json").stdout)
    for test in document["tests"]:
        assert test["bench"]["iterations"] > 1 and test["bench"]["ns_per_op"] > 0
        assert test["bench"]["us_per_op"] == pytest.approx(test["bench"]["ns_per_op"] / 1000, abs=0.002)
