"""The hash-chained audit log: what it records, what it never records, and
`portcullis audit verify` catching an altered, removed or reordered record."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import UPSTREAM_KEY, Fakes, GatewayProcess
from tests.fakes import Fail

pytestmark = pytest.mark.served

SECRET_PROMPT = "my card is 4111 1111 1111 1111 and the launch code is ZEBRA-42"


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(path)], capture_output=True, text=True)


@pytest.fixture
def busy_gateway(fresh_gateway, fakes: Fakes) -> GatewayProcess:
    gateway = fresh_gateway()
    key = gateway.key("eng")
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    claude.messages.create(model="sonnet", max_tokens=8, messages=[{"role": "user", "content": SECRET_PROMPT}])
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", Fail(529))
    with claude.messages.stream(model="sonnet", max_tokens=8, system=SECRET_PROMPT, messages=[{"role": "user", "content": SECRET_PROMPT}]) as stream:
        stream.get_final_message()
    chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    chat.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": SECRET_PROMPT}])
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng", "carol"), max_retries=0).messages.create(
            model="sonnet", max_tokens=8, messages=[{"role": "user", "content": SECRET_PROMPT}]
        )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.url, api_key="pk-" + "Z" * 43, max_retries=0).messages.create(model="sonnet", max_tokens=8, messages=[])
    return gateway


def test_records_link_start_to_outcome(busy_gateway: GatewayProcess) -> None:
    records = busy_gateway.settled()
    started = [r for r in records if r["event"] == "request_started"]
    assert len(started) == 3
    for record in started:
        outcome = [r for r in records if r.get("request_id") == record["request_id"] and r["event"] != "request_started"]
        assert [r["event"] for r in outcome] == ["request_finished"]
        assert outcome[0]["seq"] > record["seq"]
        assert record["bundle"]["revision"] == "test-1" and len(record["bundle"]["digest"]) == 64
        assert record["principal"]["team"] == "eng" and record["principal"]["key_id"].startswith("key_")
    failover = next(r for r in records if r["event"] == "request_finished" and len(r["attempts"]) == 2)
    assert failover["attempts"][0]["outcome"] == "status_529" and failover["cost_micro_usd"] == 660  # eu price: 100 × 3.30 + 20 × 16.50
    denied = [r for r in records if r["event"] == "request_denied"]
    assert {r["stage"] for r in denied} == {"decide", "authenticate"}
    assert next(r for r in denied if r["stage"] == "decide")["decision"]["reasons"] == ["model_not_allowed"]


def test_no_prompt_key_or_provider_secret_is_written_anywhere(busy_gateway: GatewayProcess) -> None:
    busy_gateway.settled()
    written = busy_gateway.audit_path.read_text() + busy_gateway.logs()
    for secret in [SECRET_PROMPT, "4111 1111", "ZEBRA-42", UPSTREAM_KEY, "pk-" + "Z" * 43, *busy_gateway.keys.values()]:
        assert secret not in written


def test_intact_log_verifies(busy_gateway: GatewayProcess) -> None:
    busy_gateway.settled()
    result = verify(busy_gateway.audit_path)
    assert result.returncode == 0, result.stdout
    assert f"{len(busy_gateway.audit_records())} records, chain intact" in result.stdout


def tampered(path: Path, tmp_path: Path, change) -> Path:
    lines = path.read_text().splitlines(keepends=True)
    copy = tmp_path / "tampered.jsonl"
    copy.write_text("".join(change(lines)))
    return copy


def alter_cost(lines: list[str]) -> list[str]:
    index = next(i for i, line in enumerate(lines) if '"cost_micro_usd"' in line)
    record = json.loads(lines[index])
    record["cost_micro_usd"] = 1
    lines[index] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    return lines


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (alter_cost, "was altered"),
        (lambda lines: lines[:2] + lines[3:], "was removed, reordered or inserted"),
        (lambda lines: [lines[1], lines[0], *lines[2:]], "was removed, reordered or inserted"),
        (lambda lines: [*lines, '{"partial": '], "not a JSON record"),
    ],
    ids=["altered", "removed", "reordered", "truncated-write"],
)
def test_tampering_is_detected_and_located(busy_gateway: GatewayProcess, tmp_path: Path, change, problem: str) -> None:
    result = verify(tampered(busy_gateway.audit_path, tmp_path, change))
    assert result.returncode == 1
    assert problem in result.stdout and "line " in result.stdout


def test_chain_continues_across_restarts(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()
    anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0).messages.create(
        model="haiku", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )
    gateway.stop()
    gateway.start()
    anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0).messages.create(
        model="haiku", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )
    records = gateway.audit_records()
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1)) and len(records) == 5
    assert records[2]["event"] == "gateway_stopped" and records[2]["signal"] == "SIGTERM"  # a clean stop is on the record
    assert verify(gateway.audit_path).returncode == 0


def test_a_damaged_log_stops_start_up(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()
    gateway.stop()
    with gateway.audit_path.open("a") as handle:
        handle.write('{"seq": 1, "hash": "forged"}\n')
    with pytest.raises(RuntimeError, match="altered record"):
        gateway.start()


def test_a_torn_tail_is_cut_and_recorded_at_start_up(fresh_gateway, fakes: Fakes) -> None:
    """A write torn by a crash or a full disk (bytes after the last newline) no longer
    stops the gateway or breaks `audit verify`: start-up cuts it, keeps the bytes in a
    side file and links an `audit_repaired` record carrying their length and digest."""
    gateway = fresh_gateway()
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    claude.messages.create(model="haiku", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    gateway.stop()
    intact = gateway.audit_path.read_bytes()
    last_seq = json.loads(intact.splitlines()[-1])["seq"]
    torn = b'{"event":"request_started","principal":{"team":"eng"'
    with gateway.audit_path.open("ab") as handle:
        handle.write(torn)
    assert verify(gateway.audit_path).returncode == 1  # the tear is visible until the gateway repairs it

    gateway.start()
    claude.messages.create(model="haiku", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    gateway.settled()
    records = gateway.audit_records()
    repaired = records[last_seq]
    assert repaired["event"] == "audit_repaired" and repaired["seq"] == last_seq + 1 and repaired["after_seq"] == last_seq
    assert repaired["cut_bytes"] == len(torn) and repaired["cut_sha256"] == hashlib.sha256(torn).hexdigest()
    assert (gateway.audit_path.parent / repaired["quarantined_to"]).read_bytes() == torn
    assert gateway.audit_path.read_bytes().startswith(intact) and torn not in gateway.audit_path.read_bytes()
    assert [r["event"] for r in records[last_seq + 1 :]][:2] == ["request_started", "request_finished"]
    result = verify(gateway.audit_path)
    assert result.returncode == 0, result.stdout
    assert f"torn writes cut at start-up and recorded: 1 (audit_repaired at seq {last_seq + 1})" in result.stdout
    assert "torn write" in gateway.logs() and "Traceback" not in gateway.logs()


def test_a_log_that_is_all_torn_write_restarts_the_chain_from_genesis(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()
    gateway.stop()
    gateway.audit_path.write_bytes(b'{"event":"request_st')  # the very first record was torn
    gateway.start()
    gateway.stop()
    records = gateway.audit_records()
    assert [(r["seq"], r["event"]) for r in records] == [(1, "audit_repaired"), (2, "gateway_stopped")]
    assert records[0]["after_seq"] == 0 and records[0]["cut_bytes"] == 20
    assert verify(gateway.audit_path).returncode == 0
