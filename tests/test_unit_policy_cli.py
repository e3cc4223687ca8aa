"""`portcullis policy test` behaves like `opa test`: per-test results, counts, and a
non-zero exit on any failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def policy_test(*paths: Path, verbose: bool = False) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "test", *map(str, paths)] + (["-v"] if verbose else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_the_repository_policy_tests_pass() -> None:
    result = policy_test(ROOT / "policies", ROOT / "policy-tests", verbose=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "PASS: " in result.stdout
    assert "data.portcullis_test.test_fallback_model_outside_the_grants_is_never_a_target: PASS" in result.stdout


def test_a_failing_test_fails_the_run_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "x_test.rego").write_text('package x\n\ntest_ok if true\n\ntest_broken if {\n\tprint("value was", 1)\n\t1 == 2\n}\n')
    result = policy_test(tmp_path)
    assert result.returncode == 1
    assert "data.x.test_broken: FAIL" in result.stdout and "value was 1" in result.stdout
    assert "PASS: 1/2" in result.stdout and "FAIL: 1/2" in result.stdout


def test_data_files_load_at_their_path(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "data.yaml").write_text("limit: 3\n")
    (tmp_path / "y_test.rego").write_text("package y\n\ntest_data if data.cfg.limit == 3\n")
    assert policy_test(tmp_path).returncode == 0


def test_no_tests_and_broken_modules_are_errors(tmp_path: Path) -> None:
    (tmp_path / "a.rego").write_text("package a\n\nx := 1\n")
    assert "no tests found" in policy_test(tmp_path).stderr
    (tmp_path / "b_test.rego").write_text("package b\n\ntest_x if {\n")
    broken = policy_test(tmp_path)
    assert broken.returncode == 1 and "b_test.rego" in broken.stderr and "Traceback" not in broken.stderr


def test_keys_create_warns_about_a_team_the_bundle_does_not_know(tmp_path: Path) -> None:
    config = tmp_path / "portcullis.yaml"
    config.write_text(f"policy: {{bundle: {ROOT / 'policies'}}}\nproviders: [{{name: mock, type: mock}}]\nstore: {{path: {tmp_path / 's.db'}}}\n")
    created = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "keys", "create", "--config", str(config), "--team", "ghost"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0
    assert created.stdout.startswith("pk-") and "team 'ghost' is not in bundle revision" in created.stderr


def test_keys_create_refuses_names_the_bundle_could_never_hold(tmp_path: Path) -> None:
    config = tmp_path / "portcullis.yaml"
    config.write_text(f"policy: {{bundle: {ROOT / 'policies'}}}\nproviders: [{{name: mock, type: mock}}]\nstore: {{path: {tmp_path / 's.db'}}}\n")
    refused = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "keys", "create", "--config", str(config), "--team", "demo", "--user", "a b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "--user must be" in refused.stderr and not refused.stdout
