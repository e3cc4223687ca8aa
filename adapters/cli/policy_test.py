"""``portcullis policy test``: run a bundle's Rego unit tests the way ``opa test`` does,
with ``--run``, ``--coverage``/``--threshold``, ``--bench`` and ``--format json``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from portcullis.adapters.cli.common import DEFAULT_CONFIG, QUICKSTART_CONFIG, Failure, config_path
from portcullis.adapters.config import load_config

if TYPE_CHECKING:
    from portcullis.engine.policy_tests import TestResult

POLICY_TESTS = Path("policy-tests")
_STATUS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}
EXIT_THRESHOLD = 2  # as opa test: the tests passed, the coverage did not


def register(policy: Any) -> None:
    test = policy.add_parser("test", help="run *_test.rego tests (test_* rules) the way `opa test` does")
    test.add_argument("paths", nargs="*", type=Path, help="bundle directories or directories of tests (default: the configured bundle and ./policy-tests)")
    test.add_argument(
        "--config",
        "-c",
        help=f"configuration whose bundle is tested when no paths are given (default: $PORTCULLIS_CONFIG, ./{DEFAULT_CONFIG} or {QUICKSTART_CONFIG})",
    )
    test.add_argument("--verbose", "-v", action="store_true", help="print passing tests too, with their print() output")
    # dest is not "run": main() dispatches on args.run
    test.add_argument("--run", "-r", dest="pattern", metavar="REGEX", help="only the tests whose path (data.pkg.test_x) the regular expression finds")
    test.add_argument("--coverage", action="store_true", help="report the policy modules' line coverage (test files are not counted)")
    test.add_argument("--threshold", type=_percent, metavar="PERCENT", help="fail when total coverage is below PERCENT (implies --coverage)")
    test.add_argument("--bench", action="store_true", help="time each test over repeated runs: iterations and ns/op (µs/op)")
    test.add_argument("--bench-time", type=_seconds, default=1.0, metavar="SECONDS", help="how long --bench runs each test (default: 1)")
    test.add_argument("--format", choices=["pretty", "json"], default="pretty", help="pretty (default) or json")
    test.set_defaults(run=_policy_test)


def _policy_test(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError
    from portcullis.engine.policy_coverage import as_json, report_lines, threshold_message
    from portcullis.engine.policy_tests import run_suite
    from portcullis.engine.rego import PolicyError

    pattern = _pattern(args.pattern)
    want_coverage = args.coverage or args.threshold is not None
    paths = list(args.paths) or _configured_test_paths(args.config)
    try:
        modules, policy_files, data = _read_sources(paths)
        run = run_suite(
            modules,
            data,
            run=pattern,
            coverage_of_files=policy_files if want_coverage else None,
            bench_ns=int(args.bench_time * 1e9) if args.bench else 0,
        )
    except (BundleError, PolicyError) as error:
        raise Failure(str(error)) from None
    if not run.results:
        where = ", ".join(map(str, paths))
        if pattern:
            raise Failure(f"no tests in {where} match --run {pattern.pattern!r}")
        raise Failure(f"no tests found in {where} (test rules are named test_* in *.rego files)")
    unmet = threshold_message(run.coverage, args.threshold) if run.coverage is not None and args.threshold is not None else None
    if args.format == "json":
        document = _json_document(run.results)
        if run.coverage is not None:
            document["coverage"] = as_json(run.coverage)
        if args.threshold is not None:
            document["threshold"] = {"required": args.threshold, "met": unmet is None}
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        _print_pretty(run.results, verbose=args.verbose or args.bench)
        if run.coverage is not None:
            print("-" * 60)
            print("\n".join(report_lines(run.coverage)))
    if unmet:
        print(unmet, file=sys.stderr)
    if any(not result.passed for result in run.results):
        return 1
    return EXIT_THRESHOLD if unmet else 0


def _read_sources(paths: list[Path]) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """Every module under ``paths`` by its shown name (path/name), the names of the
    policy (not test) modules among them, and the merged data document."""
    from portcullis.engine.bundle import merge_data, read_bundle_files, split_sources

    modules: dict[str, str] = {}
    policy_files: list[str] = []
    data: dict[str, Any] = {}
    for path in paths:
        if not path.exists():
            raise Failure(f"{path}: no such file or directory")
        files = {name: content for name, content in read_bundle_files(path).items() if name.endswith((".rego", ".json", ".yaml", ".yml"))}
        found_modules, found_tests, found_data = split_sources(files)
        if not (found_modules or found_tests or found_data):
            raise Failure(f"no tests found in {path}: it holds no *.rego or data files")
        modules.update({f"{path}/{name}": source for name, source in {**found_modules, **found_tests}.items()})
        policy_files.extend(f"{path}/{name}" for name in found_modules)
        data = merge_data(data, found_data)
    return modules, policy_files, data


def _print_pretty(results: list[TestResult], *, verbose: bool) -> None:
    current_file = None
    for result in results:
        if result.passed and not verbose:
            continue
        if result.file != current_file:
            current_file = result.file
            print(f"{result.file}:")
        where = "" if result.passed else f" at {result.file}:{result.line}"
        print(f"  {result.path}: {_STATUS[result.status]} ({_timing(result)}){where}")
        _print_section("print output", result.prints)
        _print_section("error", result.error.splitlines() if result.error else [])  # a regorus error spans several lines
        _print_section("fails at", result.explanation)
    counts = {status: sum(result.status == status for result in results) for status in _STATUS}
    print("-" * 60)
    print("\n".join(f"{_STATUS[status]}: {count}/{len(results)}" for status, count in counts.items() if count or status == "pass"))


def _print_section(title: str, lines: list[str]) -> None:
    if lines:
        print(f"    {title}:")
        for line in lines:
            print(f"      {line}")


def _timing(result: TestResult) -> str:
    if result.bench is None:
        return _duration(result.duration_ns)
    ns = result.bench.ns_per_op
    return f"{result.bench.iterations} iterations, {ns:.0f} ns/op, {ns / 1000:.2f} µs/op"


def _duration(ns: int) -> str:
    """As opa test shows a duration: µs under a millisecond, then ms, then s."""
    if ns < 1_000_000:
        return f"{ns // 1000}µs"
    return f"{ns / 1e6:.2f}ms" if ns < 1_000_000_000 else f"{ns / 1e9:.2f}s"


def _json_document(results: list[TestResult]) -> dict[str, Any]:
    """Like opa test --format json: one object per test (durations in ns), then the counts."""
    tests = []
    for result in results:
        test: dict[str, Any] = {
            "package": result.package,
            "name": result.name,
            "path": result.path,
            "file": result.file,
            "line": result.line,
            "status": result.status,
            "passed": result.passed,
            "failed": result.status == "fail",
            "error": result.error,
            "duration": result.duration_ns,
            "output": result.prints,
            "explanation": result.explanation,
        }
        if result.bench:
            bench = result.bench
            test["bench"] = {"iterations": bench.iterations, "ns_per_op": round(bench.ns_per_op), "us_per_op": round(bench.ns_per_op / 1000, 3)}
        tests.append(test)
    summary = {status: sum(result.status == status for result in results) for status in _STATUS}
    return {"tests": tests, "summary": {"total": len(results), **summary}}


def _configured_test_paths(config_option: str | None) -> list[Path]:
    """No paths given: the bundle the configuration serves, plus policy-tests/ here or
    beside the bundle (the repository's layout) when there is one."""
    source = config_path(config_option, "bundle and tests")
    config = load_config(source)
    bundle = Path(os.path.relpath(config.bundle_path))
    tests = next((path for path in (POLICY_TESTS, bundle.parent / POLICY_TESTS) if path.is_dir()), None)
    paths = [bundle] + ([Path(os.path.relpath(tests))] if tests else [])
    print(f"testing {', '.join(map(str, paths))} (bundle of {source})", file=sys.stderr)
    return paths


def _pattern(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as error:
        raise Failure(f"--run {text!r} is not a regular expression: {error}") from None


def _percent(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text} is not a percentage from 0 to 100")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value
