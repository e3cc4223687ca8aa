"""Bounded work per request: count caps refused before the walk, large bodies handled
off the event loop (other clients keep being served), slow-drip clients cut off, and a
total deadline over a whole failover chain."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bundles import CATALOG, TENANTS, deep_copy, write_bundle
from tests.conftest import Fakes
from tests.fakes import Hang

pytestmark = pytest.mark.served

ANTHROPIC = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
HAIKU_UPSTREAM = "claude-haiku-4-5-20251001"
TOOL = {"name": "tool", "description": "Does one thing with its argument.", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}


def post(url: str, key: str, body: bytes, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", content=body, headers={**ANTHROPIC, "x-api-key": key}, timeout=timeout)


def agent_sized_body() -> dict[str, Any]:
    """Shaped like a coding agent's turn: 3 system blocks, 25 tools, a long history (~400 KB)."""
    tools = [{**TOOL, "name": f"tool_{i}", "description": "Does one thing. " * 40} for i in range(25)]
    history = []
    for turn in range(300):
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": "output line\n" * 80}]})
        history.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{turn + 1}", "name": "tool_1", "input": {"a": "x"}}]})
    history[0] = {"role": "user", "content": "start"}
    history.append({"role": "user", "content": "go on"})
    system = [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Rules. " * 500, "cache_control": {"type": "ephemeral"}}] * 2
    return {"model": "haiku", "max_tokens": 64, "system": system[:3], "tools": tools, "messages": history, "thinking": {"type": "disabled"}}


def test_default_caps_admit_an_agent_sized_request(fresh_gateway: Any, fakes: Fakes) -> None:
    gateway = fresh_gateway(limits={"max_request_bytes": 16 * 1024 * 1024})
    body = json.dumps(agent_sized_body()).encode()
    assert len(body) > 85_000
    response = post(gateway.url, gateway.key("eng"), body)
    assert response.status_code == 200, response.text
    sent = fakes.anthropic_eu.received[-1]
    assert sent.body == body.replace(b'"haiku"', f'"{HAIKU_UPSTREAM}"'.encode(), 1)
    assert "transfer-encoding" not in sent.headers and sent.headers["content-length"] == str(len(sent.body))  # written in slices, not chunked


@pytest.mark.parametrize(
    ("limits", "body", "code"),
    [
        ({"max_tools": 10}, {"tools": [TOOL] * 11}, "too_many_tools"),
        ({"max_messages": 5}, {"messages": [{"role": "user", "content": "x"}] * 6}, "too_many_messages"),
        ({"max_content_blocks": 5}, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 6}]}, "too_many_content_blocks"),
        ({"max_nesting_depth": 10}, {"metadata": {"user_id": "u", "x": json.loads("[" * 12 + "]" * 12)}}, "nesting_too_deep"),
    ],
)
def test_each_cap_is_configurable_and_refused_with_its_code(fresh_gateway: Any, fakes: Fakes, limits: dict, body: dict, code: str) -> None:
    gateway = fresh_gateway(limits=limits)
    request = {"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **body}
    response = post(gateway.url, gateway.key("eng"), json.dumps(request).encode())
    assert response.status_code == 413 and response.headers["x-portcullis-error-code"] == code
    assert response.json()["error"]["code"] == code
    assert not any(fake.received for fake in fakes.all())


HEALTH_PROBE = """
import sys, time, httpx
url, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
with httpx.Client() as client:
    while time.monotonic() < end:
        started = time.perf_counter()
        assert client.get(url).status_code == 200
        print(round((time.perf_counter() - started) * 1000, 2), flush=True)
        time.sleep(0.01)
"""


def _healthz_during(url: str, send: Any) -> list[float]:
    """/healthz latencies (ms) probed from another process while ``send`` runs."""
    probe = subprocess.Popen([sys.executable, "-c", HEALTH_PROBE, f"{url}/healthz", "5"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    send()
    out, _ = probe.communicate(timeout=30)
    assert probe.returncode == 0
    return [float(line) for line in out.split()]


def test_healthz_answers_while_a_huge_body_is_parsed_and_inspected(fresh_gateway: Any, fakes: Fakes, tmp_path: Path) -> None:
    catalog = deep_copy(CATALOG)  # a window the 10 MB conversation fits, by its byte bound too, so it is served
    catalog["models"]["claude-haiku-4-5"]["targets"][0]["context_window"] = 16 * 1024 * 1024
    gateway = fresh_gateway(bundle=write_bundle(tmp_path / "bundle", deep_copy(TENANTS), catalog), limits={"max_request_bytes": 16 * 1024 * 1024})
    key = gateway.key("eng")
    tools = [{**TOOL, "name": f"tool_{i}"} for i in range(100_000)]
    refused = json.dumps({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": tools}).encode()
    words = "the quick brown fox jumps over the lazy dog near the river bank " * 110
    history = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} {words}"} for i in range(1601)]
    accepted = json.dumps({"model": "haiku", "max_tokens": 5, "messages": history}).encode()
    assert len(refused) > 10_000_000 and len(accepted) > 10_000_000
    outcomes: list[int] = []

    def send() -> None:
        outcomes.append(post(gateway.url, key, refused).status_code)
        outcomes.append(post(gateway.url, key, accepted).status_code)

    latencies = sorted(_healthz_during(gateway.url, send))
    assert outcomes == [413, 200]
    # Shared CI cores make single probes noisy; a loop blocked by the walk (seconds, before)
    # delays every probe sent meanwhile, which the 95th percentile sees.
    assert latencies[int(len(latencies) * 0.95)] < 50, latencies[-10:]
    assert "Traceback" not in gateway.logs()


def _connect(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port))
    connection.settimeout(10)
    return connection


def _closed_after(connection: socket.socket, drip: bytes) -> tuple[float, bytes]:
    """Sends ``drip`` one byte every 0.2 s; returns when the gateway closes the connection."""
    started, received = time.monotonic(), b""
    connection.setblocking(False)
    for byte in drip:
        try:
            connection.send(bytes([byte]))
        except OSError:
            break
        time.sleep(0.2)
        try:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        except BlockingIOError:
            continue
        except OSError:
            break
    return time.monotonic() - started, received


def test_slow_drip_headers_and_bodies_are_cut_off(fresh_gateway: Any, fakes: Fakes) -> None:
    gateway = fresh_gateway(limits={"header_timeout_seconds": 1, "body_timeout_seconds": 1})
    start = f"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {gateway.key('eng')}\r\nanthropic-version: 2023-06-01\r\n"
    headers = start.encode() + b"x-pad: " + b"p" * 200
    elapsed, received = _closed_after(_connect(gateway.port), headers)
    assert 0.8 < elapsed < 3 and received == b""  # closed, not answered: there is no request to answer yet

    body = json.dumps({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 100}]}).encode()
    connection = _connect(gateway.port)
    connection.sendall(headers[: headers.index(b"x-pad")] + f"content-length: {len(body)}\r\n\r\n".encode())
    elapsed, received = _closed_after(connection, body)
    assert 0.8 < elapsed < 3
    assert received.startswith(b"HTTP/1.1 408") and b"body_timeout" in received
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    assert not any(fake.received for fake in fakes.all())


def test_a_total_deadline_bounds_the_whole_failover_chain(fresh_gateway: Any, fakes: Fakes) -> None:
    gateway = fresh_gateway(limits={"request_deadline_seconds": 4})
    for fake, model in ((fakes.anthropic_us, SONNET_UPSTREAM), (fakes.anthropic_eu, SONNET_UPSTREAM), (fakes.anthropic_eu, HAIKU_UPSTREAM)):
        fake.script(model, Hang(10))  # each attempt ends at the 3 s read timeout: ~9 s for the chain without a deadline
    started = time.monotonic()
    response = post(gateway.url, gateway.key("eng"), json.dumps({"model": "sonnet", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).encode())
    elapsed = time.monotonic() - started
    assert response.status_code == 504 and response.headers["x-portcullis-error-code"] == "request_deadline"
    assert 3.8 < elapsed < 5.5
    outcome = gateway.outcome(response.headers["x-portcullis-request-id"])
    assert outcome["event"] == "request_failed" and outcome["error"]["code"] == "request_deadline"
    assert [attempt["outcome"] for attempt in outcome["attempts"]] == ["timeout"]  # the second was cut by the deadline
