"""Signed bundles and hot reload: a good bundle swaps in atomically; a bad, unsigned,
tampered or wrongly signed one is refused while the old one keeps serving."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.bundles import CATALOG, TENANTS, deep_copy, write_bundle
from tests.conftest import Fakes, GatewayProcess, wait_for
from tests.fakes import Reply

pytestmark = pytest.mark.served

HI = [{"role": "user", "content": "Hi"}]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", *args], capture_output=True, text=True)


def keypair(directory: Path, name: str, kind: str = "rsa") -> tuple[Path, Path]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    private_path, public_path = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private_path.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public_path.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def revision(gateway: GatewayProcess) -> str:
    return httpx.get(f"{gateway.url}/readyz").json()["bundle"]["revision"]


def status_of(gateway: GatewayProcess, model: str, team: str = "eng") -> int:
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": model, "max_tokens": 8, "messages": HI},
        headers={"x-api-key": gateway.key(team), "anthropic-version": "2023-06-01"},
    )
    return response.status_code


def narrowed_tenants() -> dict:
    tenants = deep_copy(TENANTS)
    tenants["teams"]["eng"]["models"] = ["gpt-*"]
    return tenants


def test_changed_bundle_is_picked_up_and_bad_one_refused(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    gateway = fresh_gateway(bundle=bundle)
    assert status_of(gateway, "haiku") == 200

    write_bundle(bundle, tenants=narrowed_tenants(), revision="r2")
    assert wait_for(lambda: revision(gateway) == "r2")
    assert status_of(gateway, "haiku") == 403

    (bundle / "portcullis" / "decision.rego").write_text("package portcullis\n\ndecision := {")  # a syntax error
    (bundle / ".manifest").write_text('{"revision": "r3-broken", "roots": ["portcullis"]}')
    assert wait_for(lambda: "revision 'r2'" in gateway.logs() and "refused" in gateway.logs())
    assert revision(gateway) == "r2" and status_of(gateway, "gpt-4o-mini") == 200


def test_bundle_whose_own_tests_fail_is_refused(tmp_path: Path, fresh_gateway) -> None:
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    gateway = fresh_gateway(bundle=bundle, policy={"watch_interval_seconds": 0})
    write_bundle(bundle, revision="r2", extra={"portcullis/own_test.rego": "package portcullis\n\ntest_always_fails if false\n"})
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: "own policy tests fail: data.portcullis.test_always_fails" in gateway.logs())
    assert revision(gateway) == "r1"
    own_test = 'package portcullis\n\ntest_sonnet_resolves if data.portcullis.access.resolve("sonnet") == "claude-sonnet-4-5"\n'
    write_bundle(bundle, revision="r3", extra={"portcullis/own_test.rego": own_test})
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: revision(gateway) == "r3")


def test_route_without_price_refuses_to_start_and_to_load(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    catalog = deep_copy(CATALOG)
    catalog["prices"] = [p for p in catalog["prices"] if p["model"] != "claude-opus-4-1-20250805"]
    with pytest.raises(RuntimeError, match=r"no price in effect for anthropic-us/claude-opus-4-1-20250805"):
        fresh_gateway(bundle=write_bundle(tmp_path / "unpriced", catalog=catalog))
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    gateway = fresh_gateway(bundle=bundle, policy={"watch_interval_seconds": 0})
    write_bundle(bundle, catalog=catalog, revision="r2")
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: "no price in effect" in gateway.logs())
    assert revision(gateway) == "r1"


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_only_bundles_signed_by_a_configured_key_load(tmp_path: Path, fresh_gateway, algorithm: str) -> None:
    kind = "rsa" if algorithm == "RS256" else "ec"
    release_key, release_pub = keypair(tmp_path, "release", kind)
    rogue_key, _ = keypair(tmp_path, "rogue", kind)
    bundle = write_bundle(tmp_path / "bundle", revision="signed-1")
    assert cli("policy", "sign", str(bundle), "--signing-key", str(release_key), "--signing-alg", algorithm, "--key-id", "release").returncode == 0
    keys = [{"id": "release", "algorithm": algorithm, "key_file": str(release_pub)}]
    gateway = fresh_gateway(bundle=bundle, policy={"public_keys": keys, "watch_interval_seconds": 0})
    assert revision(gateway) == "signed-1"

    def attempt(expected_log: str) -> None:
        gateway.signal(signal.SIGHUP)
        assert wait_for(lambda: gateway.logs().count(expected_log) >= 1), gateway.logs()
        assert revision(gateway) == "signed-1"

    write_bundle(bundle, tenants=narrowed_tenants(), revision="unsigned-2")  # no .signatures.json at all
    attempt("bundle is not signed")

    cli("policy", "sign", str(bundle), "--signing-key", str(rogue_key), "--signing-alg", algorithm, "--key-id", "release")
    attempt("does not verify with key 'release'")

    cli("policy", "sign", str(bundle), "--signing-key", str(release_key), "--signing-alg", algorithm, "--key-id", "release")
    (bundle / "portcullis" / "tenants" / "data.yaml").write_text((bundle / "portcullis" / "tenants" / "data.yaml").read_text().replace("gpt-*", "'*'"))
    attempt("does not match its signed digest")

    (bundle / "portcullis" / "extra.rego").write_text("package portcullis\n\nsmuggled := true\n")
    attempt("is not covered by the bundle signature")

    (bundle / "portcullis" / "extra.rego").unlink()
    write_bundle(bundle, tenants=narrowed_tenants(), revision="signed-2")
    assert cli("policy", "sign", str(bundle), "--signing-key", str(release_key), "--signing-alg", algorithm, "--key-id", "release").returncode == 0
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: revision(gateway) == "signed-2")
    assert status_of(gateway, "haiku") == 403


def test_unsigned_bundle_does_not_start_when_keys_are_required(tmp_path: Path, fresh_gateway) -> None:
    _, public = keypair(tmp_path, "release")
    with pytest.raises(RuntimeError, match="bundle is not signed"):
        fresh_gateway(bundle=write_bundle(tmp_path / "bundle"), policy={"public_keys": [{"id": "release", "algorithm": "RS256", "key_file": str(public)}]})


def test_tarball_bundle_reloads(tmp_path: Path, fresh_gateway) -> None:
    source = write_bundle(tmp_path / "source", revision="tar-1")
    tarball = tmp_path / "bundle.tar.gz"
    assert cli("policy", "build", str(source), "-o", str(tarball)).returncode == 0
    gateway = fresh_gateway(bundle=tarball)
    assert revision(gateway) == "tar-1"
    write_bundle(source, tenants=narrowed_tenants(), revision="tar-2")
    cli("policy", "build", str(source), "-o", str(tmp_path / "next.tar.gz"))
    (tmp_path / "next.tar.gz").replace(tarball)  # an atomic rename, as a deploy would do
    assert wait_for(lambda: revision(gateway) == "tar-2")


def test_in_flight_request_finishes_on_the_bundle_it_started_with(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    bundle = write_bundle(tmp_path / "bundle", revision="before")
    gateway = fresh_gateway(bundle=bundle, policy={"watch_interval_seconds": 0})
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", Reply(text="a slow answer in many pieces", event_delay=0.3))
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    result: dict = {}

    def stream() -> None:
        with client.messages.stream(model="haiku", max_tokens=8, messages=HI) as events:
            result["text"] = "".join(events.text_stream)
            result["request_id"] = events.response.headers["x-portcullis-request-id"]

    worker = threading.Thread(target=stream)
    worker.start()
    assert wait_for(lambda: fakes.anthropic_eu.received)
    write_bundle(bundle, tenants=narrowed_tenants(), revision="after")
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: revision(gateway) == "after")
    assert status_of(gateway, "haiku") == 403  # new requests see the new bundle...
    worker.join(timeout=10)
    assert result["text"] == "a slow answer in many pieces"  # ...the one in flight finished on the old one
    assert gateway.outcome(result["request_id"])["event"] == "request_finished"
    assert gateway.records_for(result["request_id"])[0]["bundle"]["revision"] == "before"


def test_refused_reloads_log_one_line_each_and_no_traceback(tmp_path: Path, fresh_gateway) -> None:
    """Each way a bundle can be refused after its checks built policies on the loader's
    thread (failing own tests, a syntax error, an unpriced route, a decision that is not
    a plan, a model listing that fails to evaluate): one ERROR line each, no traceback, no engine dropped off its own thread, and
    the old bundle keeps serving."""
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    gateway = fresh_gateway(bundle=bundle, policy={"watch_interval_seconds": 0})
    unpriced = deep_copy(CATALOG)
    unpriced["prices"] = [p for p in unpriced["prices"] if p["model"] != "claude-opus-4-1-20250805"]

    def not_a_plan() -> None:
        write_bundle(bundle, revision="not-a-plan")
        (bundle / "portcullis" / "decision.rego").write_text('package portcullis\n\ndecision := "not a plan"\n')

    refusals = [
        lambda: write_bundle(bundle, revision="own-tests", extra={"portcullis/own_test.rego": "package portcullis\n\ntest_always_fails if false\n"}),
        lambda: write_bundle(bundle, revision="syntax", extra={"portcullis/broken.rego": "package portcullis\n\nbroken := {"}),
        lambda: write_bundle(bundle, revision="unpriced", catalog=unpriced),
        not_a_plan,
        lambda: write_bundle(bundle, revision="models-fail", extra={"portcullis/models.rego": "package portcullis\n\nvisible_models := x if { x := 1 / 0 }\n"}),
    ]
    for number, refuse in enumerate(refusals, start=1):
        refuse()
        gateway.signal(signal.SIGHUP)
        assert wait_for(lambda n=number: gateway.logs().count("refused, still serving revision 'r1'") >= n), gateway.logs()
    time.sleep(0.5)  # an engine dropped on the wrong thread reports just after the refusal line
    logs = gateway.logs()
    assert "Traceback" not in logs and "unsendable" not in logs, logs
    refusal_lines = [line for line in logs.splitlines() if "refused, still serving" in line]
    assert len(refusal_lines) == len(refusals) and all(" ERROR portcullis.bundles: " in line for line in refusal_lines), logs
    assert all(line.startswith("20") for line in logs.splitlines()), logs  # every line is a log record: nothing spills onto lines of its own
    assert revision(gateway) == "r1" and status_of(gateway, "haiku") == 200
