"""`portcullis policy check`: every activation check offline, every problem of a bundle
in one run, each with its file:line and a fix; exit 0 only for a bundle the gateway
would serve. Activation itself still refuses with the words it always used."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from portcullis.engine.activation import activate
from portcullis.engine.activation_checks import check_bundle
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from tests.bundles import CATALOG, TENANTS, deep_copy, write_bundle

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = ("anthropic-us", "anthropic-eu", "openai-main")
TODAY = dt.datetime.now(dt.UTC).date()
BROKEN_REGO = "package portcullis.broken\n\nallow if {\n\tx := \n}\n"  # regorus reports line 4


def policy_check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PORTCULLIS_CONFIG"}  # no configuration unless given
    command = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def write_config(directory: Path, providers: tuple[str, ...] = PROVIDERS, extra: str = "") -> Path:
    listed = ", ".join(f"{{name: {name}, type: mock}}" for name in providers)
    config = directory / "gateway.yaml"
    config.write_text(f"policy: {{bundle: b{extra}}}\nproviders: [{listed}]\nstore: {{path: s.db}}\n")
    return config


def line_of(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def broken_catalog(priced: bool = False) -> dict:
    """gpt-4o-mini's target names a provider no configuration has; claude-opus-4-1 loses
    its price unless ``priced``."""
    catalog = deep_copy(CATALOG)
    if not priced:
        catalog["prices"] = [price for price in catalog["prices"] if price["model"] != "claude-opus-4-1-20250805"]
    catalog["models"]["gpt-4o-mini"]["targets"][0]["provider"] = "azure"
    usd = {"input": "1", "output": "1"}
    catalog["prices"].append({"provider": "azure", "model": "gpt-4o-mini-2024-07-18", "effective_from": "2024-07-18", "usd_per_mtok": usd})
    return catalog


def rsa_key(directory: Path, name: str) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def sign(bundle: Path, key: Path, key_id: str = "release") -> None:
    signed = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "policy", "sign", str(bundle), "--signing-key", str(key), "--key-id", key_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert signed.returncode == 0, signed.stderr


def test_a_good_bundle_passes_every_check_against_its_configuration(tmp_path: Path) -> None:
    write_bundle(tmp_path / "b")
    result = policy_check("b", "--config", str(write_config(tmp_path)), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: b (revision 'test-1') against ")
    for check in ("layout", "schema", "catalog", "prices", "providers", "pii detectors", "rego", "index", "plans", "context fit"):
        assert f"  passed   {check}: " in result.stdout, check
    assert "  skipped  signature: no public key given" in result.stdout


def test_without_a_configuration_the_provider_check_says_it_was_skipped(tmp_path: Path) -> None:
    write_bundle(tmp_path / "b", catalog=broken_catalog(priced=True))
    result = policy_check("b", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr  # 'azure' is judged only against a configuration
    assert "  skipped  providers: no configuration found (give --config)" in result.stdout


def test_every_kind_of_problem_is_reported_in_one_run_with_file_line_and_hint(tmp_path: Path) -> None:
    tenants = deep_copy(TENANTS)
    tenants["teams"]["eng"]["model"] = ["*"]  # a schema error in one file does not hide the catalog's problems
    bundle = write_bundle(tmp_path / "b", tenants, broken_catalog(), extra={"portcullis/broken.rego": BROKEN_REGO})
    private, public = rsa_key(tmp_path, "release")
    sign(bundle, private)
    (bundle / "portcullis" / "lib.rego").write_text((bundle / "portcullis" / "lib.rego").read_text() + "\n# edited after signing\n")
    result = policy_check("b", "--config", str(write_config(tmp_path)), "--public-key", str(public), cwd=tmp_path)
    assert result.returncode == 1
    out = result.stdout
    catalog, tenants_file = bundle / "portcullis" / "catalog" / "data.yaml", bundle / "portcullis" / "tenants" / "data.yaml"
    expected = [
        "b/portcullis/lib.rego: signature: file portcullis/lib.rego does not match its signed digest",
        f"b/portcullis/tenants/data.yaml:{line_of(tenants_file, 'eng:')}: schema: data.portcullis.tenants.teams.eng: Additional properties are not allowed",
        f"b/portcullis/catalog/data.yaml:{line_of(catalog, 'provider: azure')}: providers: catalog.models.gpt-4o-mini.targets[0].provider: 'azure'",
        "b/portcullis/broken.rego:4: rego: syntax error: ",
    ]
    for start in expected:
        assert any(line.startswith(start) for line in out.splitlines()), (start, out)
    price = next(line for line in out.splitlines() if ": prices: catalog.models.claude-opus-4-1.targets[0]: no price in effect" in line)
    assert price.startswith("b/portcullis/catalog/data.yaml:")
    hints = [line.strip() for line in out.splitlines() if line.startswith("    hint: ")]
    price_hint = f"hint: add a price for anthropic-us/claude-opus-4-1-20250805 (region 'us-east-1', or none for every region) effective on or before {TODAY}"
    assert any(hint.startswith(price_hint) for hint in hints)
    assert "hint: remove 'model' or rename it 'models'" in hints
    assert any(hint.startswith("hint: add a provider named 'azure' to ") and hint.endswith("anthropic-eu, anthropic-us, openai-main") for hint in hints)
    assert any(hint.startswith("hint: the files changed after signing") for hint in hints)
    assert "FAIL: 5 problems in b" in out
    assert "  skipped  tests: the Rego modules do not compile" in out


def test_json_output_carries_the_same_findings(tmp_path: Path) -> None:
    write_bundle(tmp_path / "b", extra={"portcullis/broken.rego": BROKEN_REGO})
    result = policy_check("b", "--format", "json", cwd=tmp_path)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["bundle"] == "b" and document["config"] is None
    assert [(f["check"], f["file"], f["line"]) for f in document["findings"]] == [("rego", "b/portcullis/broken.rego", 4)]
    assert "providers" in document["skipped"] and "schema" in document["passed"]


def test_a_signature_by_another_key_fails_with_a_hint_and_the_signers_key_passes(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    signer, signer_public = rsa_key(tmp_path, "signer")
    _, stranger_public = rsa_key(tmp_path, "stranger")
    sign(bundle, signer)
    wrong = policy_check("b", "--public-key", str(stranger_public), cwd=tmp_path)
    assert wrong.returncode == 1
    first, hint = wrong.stdout.splitlines()[:2]
    assert first == "b/.signatures.json: signature: signature does not verify with key 'release'"
    assert hint.startswith("    hint: the bundle was signed by another key")
    right = policy_check("b", "--public-key", str(stranger_public), "--public-key", f"release={signer_public}", cwd=tmp_path)
    assert right.returncode == 0, right.stdout
    assert "  passed   signature: the signature verifies with a given key (key 'release')" in right.stdout


def test_the_configurations_public_keys_verify_when_no_key_is_given(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    signer, _ = rsa_key(tmp_path, "signer")
    _, stranger_public = rsa_key(tmp_path, "stranger")
    sign(bundle, signer)
    config = write_config(tmp_path, extra=f", public_keys: [{{id: release, algorithm: RS256, key_file: {stranger_public.name}}}]")
    result = policy_check("--config", str(config), cwd=tmp_path)  # the bundle too comes from the configuration
    assert result.returncode == 1 and "signature does not verify with key 'release'" in result.stdout


def test_a_failing_own_test_and_a_broken_data_file_are_named_by_line(tmp_path: Path) -> None:
    own_test = "package portcullis.own_test\n\ntest_holds if true\n\ntest_fails if {\n\t1 == 2\n}\n"
    write_bundle(tmp_path / "b", extra={"portcullis/own_test.rego": own_test})
    failing = policy_check("b", cwd=tmp_path)
    assert failing.returncode == 1
    assert failing.stdout.startswith("b/portcullis/own_test.rego:5: tests: the bundle's own policy test data.portcullis.own_test.test_fails fails\n")
    write_bundle(tmp_path / "b", extra={"portcullis/broken.rego": BROKEN_REGO, "portcullis/bad/data.yaml": "a: [1, 2\nb: 3\n"})
    unreadable = policy_check("b", cwd=tmp_path)
    assert unreadable.returncode == 1
    lines = unreadable.stdout.splitlines()
    assert lines[0].startswith("b/portcullis/bad/data.yaml:2: layout: portcullis/bad/data.yaml is not valid YAML")
    assert lines[1].startswith("b/portcullis/broken.rego:4: rego: syntax error")  # named although the bundle cannot be read


def test_no_bundle_and_no_configuration_is_an_error(tmp_path: Path) -> None:
    result = policy_check(cwd=tmp_path)
    assert result.returncode == 1 and "no bundle given and no configuration found" in result.stderr and "Traceback" not in result.stderr


UNDEFINED_TOOL_RULE = {"eng-tools": {"teams": ["eng"], "tools": {"deny": ["no-such-rule"]}}}


@pytest.mark.parametrize(
    ("mutate", "integrity"),
    [
        (lambda catalog: None, None),
        (lambda catalog: catalog.update(broken_catalog()), None),
        (lambda catalog: catalog.update(broken_catalog()), UNDEFINED_TOOL_RULE),  # two checks' problems, refused as one
        (lambda catalog: catalog["models"]["claude-opus-4-1"]["targets"][0].update(priority="high"), None),
    ],
)
def test_activation_refuses_with_the_first_problem_the_check_finds(tmp_path: Path, mutate, integrity) -> None:
    """The refactor's contract: one set of checks, activation stopping where check goes on."""
    catalog = deep_copy(CATALOG)
    mutate(catalog)
    bundle = parse_bundle(read_bundle_files(write_bundle(tmp_path / "b", catalog=catalog, integrity=integrity)), [])
    run = check_bundle(bundle, PROVIDERS, TODAY)
    if not run.problems:
        assert activate(bundle, PROVIDERS, TODAY).revision == "test-1"
        return
    with pytest.raises(BundleError) as refused:
        activate(bundle, PROVIDERS, TODAY)
    first = [problem for problem in run.problems if problem.check == run.problems[0].check]
    assert str(refused.value) == (first[0].message if first[0].check == "schema" else "; ".join(problem.message for problem in run.problems))


def test_the_shipped_bundle_checks_clean_against_the_quickstart() -> None:
    result = policy_check("policies", "--config", "examples/quickstart/config.yaml", cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed   providers" in result.stdout and "skipped  tests: the bundle has no *_test.rego" in result.stdout
