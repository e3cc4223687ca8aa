"""`make run`'s configuration: the default bundle and the offline mock provider,
with the key and examples `serve --demo-key` prints."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.fakes import free_port

pytestmark = pytest.mark.served

ROOT = Path(__file__).resolve().parent.parent


def quickstart_config(directory: Path) -> Path:
    """The quickstart's configuration on a free port, its state in ``directory``."""
    config = yaml.safe_load((ROOT / "examples" / "quickstart" / "config.yaml").read_text())
    config["listen"]["port"] = free_port()
    config["policy"]["bundle"] = str(ROOT / "policies")
    config["store"]["path"] = str(directory / "state.db")
    config["audit"]["path"] = str(directory / "audit.jsonl")
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@contextlib.contextmanager
def serving(path: Path) -> Iterator[tuple[str, str, str, Path]]:
    """`serve --demo-key demo/alice` until the block ends: (url, key, printed text, output file)."""
    port = yaml.safe_load(path.read_text())["listen"]["port"]
    output = path.parent / f"out-{time.monotonic_ns()}.txt"
    process = subprocess.Popen(
        [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path), "--demo-key", "demo/alice"],
        stdout=output.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PORTCULLIS_LOG_LEVEL": "INFO"},
    )
    try:
        deadline = time.monotonic() + 20
        while "export PORTCULLIS_KEY=" not in output.read_text():
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
        # Printed only once the gateway listens: the printed commands work at once, no polling.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        text = output.read_text()
        yield f"http://127.0.0.1:{port}", re.search(r"export PORTCULLIS_KEY=(\S+)", text).group(1), text, output
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, Path]]:
    with serving(quickstart_config(tmp_path_factory.mktemp("quickstart"))) as running:
        yield running


@pytest.fixture(scope="module")
def quickstart(quickstart_run: tuple[str, str, str, Path]) -> tuple[str, str, str]:
    return quickstart_run[:3]


def test_printed_examples_name_the_gateway_and_models(quickstart: tuple[str, str, str]) -> None:
    url, _, text = quickstart
    assert f'anthropic.Anthropic(base_url="{url}"' in text and f'openai.OpenAI(base_url="{url}/v1"' in text
    assert '"model": "claude-opus-5-5"' in text and '"model": "gpt-4o-mini"' in text


def test_printed_curl_example_works(quickstart: tuple[str, str, str]) -> None:
    url, key, text = quickstart
    command = text[text.index("curl -s " + url + "/v1/messages") :].split("\n\n")[0]
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env={**os.environ, "PORTCULLIS_KEY": key}, timeout=30)
    assert '"type": "message"' in result.stdout, result.stdout + result.stderr


def test_mock_provider_answers_every_protocol(quickstart: tuple[str, str, str]) -> None:
    url, key, _ = quickstart
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    assert "mock provider" in claude.messages.create(model="sonnet", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]).content[0].text
    with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert "mock provider" in "".join(stream.text_stream)
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    assert "mock provider" in chat.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content
    chunks = list(chat.chat.completions.create(model="mini", messages=[{"role": "user", "content": "Hi"}], stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens > 0
    assert "mock provider" in chat.responses.create(model="gpt-4o-mini", input="Hi").output_text
    with chat.responses.stream(model="mini", input=[{"role": "user", "content": "Hi"}]) as stream:
        assert "mock provider" in "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert stream.get_final_response().usage.output_tokens > 0
    # alice's team grants every model of the quickstart catalog; the demo bundle lets user bob only use gpt-4o-mini
    assert {m.id for m in chat.models.list()} >= {"claude-opus-4-8", "claude-opus-5-5", "claude-sonnet-5", "claude-sonnet-4-5", "gpt-4o-mini"}


# --- the agents' own defaults ---------------------------------------------------------------

AGENT_DEFAULTS = [
    "claude-opus-5-5",  # Claude Code 2.1.332: default; --model sonnet / haiku below
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
    "claude-opus-4-8",  # Claude Code 2.1.197: default, --model sonnet, --model haiku
    "claude-sonnet-5",
    "claude-haiku-4-5-20251001",  # also opencode's title call
    "claude-sonnet-4-6",  # opencode 1.18's default
]


@pytest.mark.parametrize("model", AGENT_DEFAULTS)
def test_the_models_agents_ask_for_by_default_are_served(quickstart: tuple[str, str, str], model: str) -> None:
    url, key, _ = quickstart
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    with claude.messages.stream(model=model, max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert "mock provider" in "".join(stream.text_stream)


def test_a_context_suffix_is_an_alias_of_its_model(quickstart_run: tuple[str, str, str, Path]) -> None:
    url, key, _, output = quickstart_run
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    answer = claude.messages.create(model="claude-opus-4-8[1m]", max_tokens=50, messages=[{"role": "user", "content": "Hi"}])
    assert answer.content[0].text.endswith("to claude-opus-4-8.")  # the mock echoes the upstream model it was asked for
    records = [json.loads(line) for line in (output.parent / "audit.jsonl").read_text().splitlines()]
    started = [r for r in records if r.get("requested_model") == "claude-opus-4-8[1m]"]
    assert started and started[-1]["model"] == "claude-opus-4-8"
    # a suffix the catalog does not list is an unknown model, not silently stripped
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-opus-4-8[2m]", max_tokens=50, messages=[{"role": "user", "content": "Hi"}])


# --- helpful refusals -----------------------------------------------------------------------


def test_unknown_model_names_v1_models_and_the_closest_names_in_both_protocols(quickstart_run: tuple[str, str, str, Path]) -> None:
    url, key, _, output = quickstart_run
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as refused:
        claude.messages.create(model="claude-opus-4-9", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    message = refused.value.body["error"]["message"]
    assert "GET /v1/models" in message and "closest: claude-opus-4-8, claude-opus-5-5" in message, message
    assert "[1m]" not in message  # context variants repeat their model unless one was asked for
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused_chat:
        chat.chat.completions.create(model="gpt-4o-mine", messages=[{"role": "user", "content": "Hi"}])
    chat_message = refused_chat.value.body["message"]
    assert "GET /v1/models" in chat_message and "closest: gpt-4o-mini" in chat_message, chat_message
    # nothing close: the hint still says where the list is, and suggests nothing
    with pytest.raises(openai.NotFoundError) as far:
        chat.chat.completions.create(model="llama-3-70b", messages=[{"role": "user", "content": "Hi"}])
    assert "GET /v1/models" in far.value.body["message"] and "closest" not in far.value.body["message"]
    time.sleep(0.2)
    log = output.read_text()
    assert re.search(r"status=404 outcome=unknown_model team=demo requested=claude-opus-4-9 ", log), log[-2000:]
    assert "requested=gpt-4o-mine " in log


def test_suggestions_are_only_names_the_key_may_use(quickstart_run: tuple[str, str, str, Path]) -> None:
    url, _, _, output = quickstart_run
    created = cli("keys", "create", "--config", str(output.parent / "config.yaml"), "--team", "demo", "--user", "bob")
    bob = created.stdout.strip()
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=bob, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        chat.chat.completions.create(model="claude-opus-4-9", messages=[{"role": "user", "content": "Hi"}])
    assert "claude-opus-4-8" not in refused.value.body["message"]  # bob may use gpt-4o-mini only


def test_the_log_line_of_a_refusal_shows_the_model_sanitised(quickstart_run: tuple[str, str, str, Path]) -> None:
    url, key, _, output = quickstart_run
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    for name in ("jane.doe@example.com", "4111111111111111", "bad model\nname"):
        with pytest.raises(openai.NotFoundError) as refused:
            chat.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}])
        assert name not in refused.value.body["message"]
    time.sleep(0.2)
    log = output.read_text()
    assert "jane.doe" not in log and "4111111111111111" not in log and "bad model" not in log
    assert log.count("requested=<unprintable name>") >= 3


# --- make run hygiene -----------------------------------------------------------------------


def test_a_second_run_says_the_gateway_is_already_serving(quickstart_run: tuple[str, str, str, Path]) -> None:
    url, key, _, output = quickstart_run
    second = cli("serve", "--config", str(output.parent / "config.yaml"), "--demo-key", "demo/alice")
    assert second.returncode == 0, second.stderr
    assert f"Portcullis is already serving on {url}" in second.stdout
    assert f"export PORTCULLIS_KEY={key}" in second.stdout  # the same demo key, not a new one
    assert "Traceback" not in second.stderr and "Errno" not in second.stderr
    # without --demo-key it is still a clear message, but a failure for a service manager
    plain = cli("serve", "--config", str(output.parent / "config.yaml"))
    assert plain.returncode == 1 and "already serving" in plain.stderr


def test_another_program_on_the_port_is_a_clear_error(tmp_path: Path) -> None:
    class NotPortcullis(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>someone else</html>")

        def log_message(self, *args: object) -> None:
            return None

    path = quickstart_config(tmp_path)
    server = HTTPServer(("127.0.0.1", yaml.safe_load(path.read_text())["listen"]["port"]), NotPortcullis)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = cli("serve", "--config", str(path), "--demo-key", "demo/alice")
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1
    assert "in use by another program (not a Portcullis gateway)" in result.stderr and "Traceback" not in result.stderr


def test_repeated_runs_reuse_the_demo_key_while_the_store_knows_it(tmp_path: Path) -> None:
    path = quickstart_config(tmp_path)
    with serving(path) as (_, first, text, _):
        assert "new, kept in" in text
    kept = tmp_path / "demo-key.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text())["key"] == first
    with serving(path) as (url, second, text, _):
        assert second == first and "reused from" in text
        claude = anthropic.Anthropic(base_url=url, api_key=second, max_retries=0)
        assert "mock provider" in claude.messages.create(model="sonnet", max_tokens=20, messages=[{"role": "user", "content": "Hi"}]).content[0].text
    # a revoked key is not handed out again, and neither is one the store never knew
    key_id = json.loads(kept.read_text())["key_id"]
    assert cli("keys", "revoke", "--config", str(path), key_id).returncode == 0
    with serving(path) as (_, third, text, _):
        assert third != first and "new, kept in" in text
    kept.write_text(json.dumps({"key_id": "key_0", "team": "demo", "user": "alice", "key": "pk-forged"}))
    kept.chmod(0o644)
    with serving(path) as (_, fourth, _, _):
        assert fourth not in (third, "pk-forged")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600


def test_the_start_up_text_says_which_demo_policies_are_on(quickstart: tuple[str, str, str]) -> None:
    _, _, text = quickstart
    assert "Policies on for team demo" in text
    assert "policy prompt v1" in text and "PII (demo-personal-data): pseudonymize EMAIL, PHONE" in text
    assert "$100.00 per month hard cap" in text and "/portcullis/*/data.yaml" in text


# --- policy test and audit verify -----------------------------------------------------------


def test_policy_test_without_paths_uses_the_configured_bundle_and_policy_tests() -> None:
    result = cli("policy", "test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "testing policies, policy-tests (bundle of examples/quickstart/config.yaml)" in result.stderr
    assert re.search(r"PASS: (\d+)/\1", result.stdout)
    verbose = cli("policy", "test", "-v", "--config", "examples/quickstart/config.yaml")
    assert "data.portcullis.catalog_test.test_agent_defaults_are_served_to_the_demo_team: PASS" in verbose.stdout


def test_policy_test_from_elsewhere_finds_the_tests_beside_the_bundle(tmp_path: Path) -> None:
    result = cli("policy", "test", "-v", "--config", str(ROOT / "examples" / "quickstart" / "config.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "data.portcullis.catalog_test.test_context_variant_is_its_model: PASS" in result.stdout
    nothing = cli("policy", "test", cwd=tmp_path)  # no paths and no configuration to take them from
    assert nothing.returncode == 1 and "no configuration found" in nothing.stderr


def test_a_failing_policy_test_says_why_with_the_values(tmp_path: Path) -> None:
    (tmp_path / "plan_test.rego").write_text(
        "package tests.why\n\n"
        'plan := {"model": "claude-sonnet-4-5", "targets": [1, 2]}\n\n'
        "test_model if {\n"
        "\tp := plan\n"
        "\tcount(p.targets) == 2\n"
        '\tp.model == "claude-opus-4-8"\n'
        "}\n\n"
        "test_membership if {\n"
        "\tsome n in [1, 2]\n"
        "\tn in {3, 4}\n"
        "}\n\n"
        "test_not if {\n"
        "\tnot plan.model\n"
        "}\n"
    )
    result = cli("policy", "test", str(tmp_path))
    assert result.returncode == 1
    out = result.stdout
    assert "data.tests.why.test_model: FAIL" in out and f"at {tmp_path}/plan_test.rego:5" in out
    assert f'{tmp_path}/plan_test.rego:8: p.model == "claude-opus-4-8"' in out  # the statement, not the one that held
    assert 'p.model = "claude-sonnet-4-5"' in out
    assert f"{tmp_path}/plan_test.rego:13: n in {{3, 4}}" in out and "n = one of 1, 2" in out and "{3, 4} = [3, 4]" in out
    assert f"{tmp_path}/plan_test.rego:17: not plan.model" in out and 'plan.model = "claude-sonnet-4-5"' in out


def test_a_path_without_tests_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (empty, tmp_path / "missing", ROOT / "policies"):
        result = cli("policy", "test", str(path))
        assert result.returncode == 1 and ("no tests found" in result.stderr or "no such file" in result.stderr), result.stderr
        assert "Traceback" not in result.stderr


def test_audit_verify_accepts_the_config(quickstart_run: tuple[str, str, str, Path]) -> None:
    _, _, _, output = quickstart_run
    config = output.parent / "config.yaml"
    result = cli("audit", "verify", "--config", str(config))
    assert result.returncode == 0 and f"{output.parent / 'audit.jsonl'}: " in result.stdout and "chain intact" in result.stdout
    both = cli("audit", "verify", str(output.parent / "audit.jsonl"), "--config", str(config))
    assert both.returncode == 1 and "not both" in both.stderr
