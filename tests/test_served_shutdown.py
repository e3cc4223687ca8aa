"""SIGTERM and SIGINT are clean exits: streams in flight finish within
`listen.drain_seconds`, what outlives the drain is cancelled but still settled and
recorded, then stores, providers and the audit log are closed and the process exits 0."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Fakes, GatewayProcess, wait_for
from tests.fakes import Reply

pytestmark = pytest.mark.served

HI = [{"role": "user", "content": "Hi"}]
SLOW = "a slow answer in many small pieces"


def stream_in_background(gateway: GatewayProcess, protocol: str) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    key = gateway.key("eng")

    def run() -> None:
        try:
            if protocol == "anthropic":
                client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
                with client.messages.stream(model="haiku", max_tokens=64, messages=HI) as events:
                    result["request_id"] = events.response.headers["request-id"]
                    result["text"] = "".join(events.text_stream)
            else:
                chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
                with chat.chat.completions.with_streaming_response.create(model="gpt-4o-mini", messages=HI, stream=True) as response:
                    result["request_id"] = response.headers["request-id"]
                    result["text"] = "".join(chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices)
        except Exception as error:  # the assertions below report it
            result["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    return worker, result


def wal_left(gateway: GatewayProcess) -> bool:
    """SQLite removes its write-ahead log when the last connection closes cleanly."""
    return (gateway.directory / "state.db-wal").exists()


def reservation_state(gateway: GatewayProcess, request_id: str) -> str:
    with contextlib.closing(sqlite3.connect(gateway.directory / "state.db")) as db:
        return db.execute("SELECT state FROM reservations WHERE request_id = ?", (request_id,)).fetchone()[0]


@pytest.mark.parametrize(("protocol", "signum"), [("anthropic", signal.SIGTERM), ("openai", signal.SIGINT)])
def test_signal_drains_the_stream_in_flight_then_exits_zero(fresh_gateway, fakes: Fakes, protocol: str, signum: int) -> None:
    gateway = fresh_gateway(listen={"drain_seconds": 10})
    upstream = fakes.anthropic_eu if protocol == "anthropic" else fakes.openai_main
    model = "claude-haiku-4-5-20251001" if protocol == "anthropic" else "gpt-4o-mini-2024-07-18"
    upstream.script(model, Reply(text=SLOW, event_delay=0.3))
    worker, result = stream_in_background(gateway, protocol)
    assert wait_for(lambda: upstream.received)
    assert wal_left(gateway)  # the store is open while serving
    signalled = time.monotonic()
    gateway.signal(signum)
    assert wait_for(lambda: "Waiting for connections to close" in gateway.logs(), 3)  # uvicorn has closed its listener
    with pytest.raises(httpx.ConnectError):  # no new connections while draining
        httpx.get(f"{gateway.url}/healthz", timeout=1)
    assert gateway.process is not None
    returncode = gateway.process.wait(timeout=15)
    worker.join(timeout=5)
    assert returncode == 0, gateway.logs()
    assert time.monotonic() - signalled < 10  # within the drain bound
    assert "error" not in result and result["text"] == SLOW  # the stream completed
    records = gateway.audit_records()
    finished = [r for r in records if r.get("request_id") == result["request_id"] and r["event"] == "request_finished"]
    assert len(finished) == 1 and finished[0]["outcome"] == "ok"
    assert records[-1]["event"] == "gateway_stopped" and records[-1]["signal"] == signal.Signals(signum).name
    assert records[-1]["cancelled_requests"] == 0
    assert reservation_state(gateway, result["request_id"]) == "settled"
    assert not wal_left(gateway)  # the store was closed, not abandoned
    logs = gateway.logs()
    assert "shut down cleanly" in logs and "Traceback" not in logs
    assert subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(gateway.audit_path)], capture_output=True).returncode == 0


def test_a_stream_longer_than_the_drain_is_cancelled_and_still_recorded(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(listen={"drain_seconds": 1})
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", Reply(text=SLOW, event_delay=1.0))
    worker, result = stream_in_background(gateway, "anthropic")
    assert wait_for(lambda: fakes.anthropic_eu.received)
    assert wait_for(lambda: "request_id" in result)
    signalled = time.monotonic()
    gateway.signal(signal.SIGTERM)
    assert gateway.process is not None
    returncode = gateway.process.wait(timeout=15)
    elapsed = time.monotonic() - signalled
    worker.join(timeout=5)
    assert returncode == 0, gateway.logs()
    assert elapsed < 1 + 5  # the drain bound, then the short finalisation bound
    assert "error" in result and result.get("text") != SLOW  # cut off: the client's SDK reports the incomplete stream
    records = gateway.audit_records()
    outcome = [r for r in records if r.get("request_id") == result["request_id"] and r["event"] != "request_started"]
    assert [r["event"] for r in outcome] == ["request_cancelled"]
    assert reservation_state(gateway, result["request_id"]) in {"pending", "settled"}  # charged, never lost
    assert records[-1]["event"] == "gateway_stopped" and records[-1]["cancelled_requests"] == 1
    assert not wal_left(gateway)
    assert "Traceback" not in gateway.logs()


def test_a_second_signal_skips_the_drain_and_still_records_the_outcome(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(listen={"drain_seconds": 30})
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", Reply(text=SLOW, event_delay=1.0))
    worker, result = stream_in_background(gateway, "anthropic")
    assert wait_for(lambda: "request_id" in result)
    signalled = time.monotonic()
    gateway.signal(signal.SIGTERM)
    assert wait_for(lambda: "Waiting for connections to close" in gateway.logs(), 3)
    gateway.signal(signal.SIGTERM)
    assert gateway.process is not None
    assert gateway.process.wait(timeout=15) == 0, gateway.logs()
    worker.join(timeout=5)
    assert time.monotonic() - signalled < 8  # not the 30 s drain
    outcome = [r for r in gateway.audit_records() if r.get("request_id") == result["request_id"] and r["event"] != "request_started"]
    assert [r["event"] for r in outcome] == ["request_cancelled"]
    assert reservation_state(gateway, result["request_id"]) in {"pending", "settled"}
    assert "SIGTERM again" in gateway.logs() and "Traceback" not in gateway.logs() and not wal_left(gateway)


def test_an_answer_still_awaited_after_the_drain_gets_a_retryable_503(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(listen={"drain_seconds": 1})
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", Reply(delay=2.5))
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("eng"), max_retries=0)
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            client.messages.create(model="haiku", max_tokens=8, messages=HI)
        except anthropic.APIStatusError as error:
            result["error"] = error

    worker = threading.Thread(target=call)
    worker.start()
    assert wait_for(lambda: fakes.anthropic_eu.received)
    gateway.signal(signal.SIGTERM)
    assert gateway.process is not None
    assert gateway.process.wait(timeout=15) == 0, gateway.logs()
    worker.join(timeout=5)
    error = result["error"]
    assert error.status_code == 503 and "shutting down" in error.body["error"]["message"] and error.response.headers["retry-after"] == "1"
    logs = gateway.logs()
    assert "cancelled: the shutdown drain ran out" in logs and "Traceback" not in logs
    assert gateway.audit_records()[-1]["event"] == "gateway_stopped" and not wal_left(gateway)


def test_drain_bound_is_validated(tmp_path: Path) -> None:
    from portcullis.adapters.config import ConfigError, load_config

    config = tmp_path / "bad.yaml"
    config.write_text("listen: {drain_seconds: -1}\npolicy: {bundle: b}\nproviders: [{name: m, type: mock}]\n")
    with pytest.raises(ConfigError, match="drain_seconds"):
        load_config(config)
