"""``workers: N``: one port, N gateway processes under a supervisor, and everything they
must share shared — hard caps and rates, auth throttling, the PII vault — on the
embedded store (one SQLite file, state hosted by the supervisor) and the shared one.
Real processes, real HTTP; requests are spread over workers by the kernel."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml

from portcullis.adapters.worker import worker_audit_paths
from tests.bundles import write_bundle
from tests.conftest import OUTCOME_EVENTS, UPSTREAM_KEY, Fakes, GatewayProcess, free_port, gateway_config, wait_for
from tests.fakes import Reply
from tests.governance_helpers import (
    ACTUAL,
    BODY,
    METERED_UPSTREAM,
    away_from_minute_edge,
    budget_cap,
    headers,
    ledger_rows,
    metered_bundle,
    shared,
    unique_team,
)
from tests.pii_helpers import EMAIL, SONNET_UPSTREAM, pii_bundle

pytestmark = pytest.mark.served


def with_workers(fresh_gateway: Any, workers: int, **overrides: Any) -> GatewayProcess:
    """A gateway of ``workers`` processes, once every one of them serves (``/readyz`` answers with the first)."""
    gateway = fresh_gateway(workers=workers, **overrides)
    assert wait_for(lambda: f"{workers} workers serving" in gateway.logs(), timeout=40), gateway.logs()
    return gateway


def chains(gateway: GatewayProcess) -> list[Path]:
    return [gateway.audit_path, *worker_audit_paths(gateway.audit_path)]


def records_by_worker(gateway: GatewayProcess) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in path.read_text().splitlines() if line.strip()] for path in chains(gateway)]


def worker_of(gateway: GatewayProcess, request_id: str) -> int:
    for index, records in enumerate(records_by_worker(gateway)):
        if any(r.get("request_id") == request_id for r in records):
            return index
    raise AssertionError(f"{request_id} is in no worker's audit chain")


def worker_pids(gateway: GatewayProcess) -> set[int]:
    assert gateway.process is not None
    found = subprocess.run(["pgrep", "-P", str(gateway.process.pid)], capture_output=True, text=True).stdout.split()
    return {int(pid) for pid in found}


def on_store(store: str, request: pytest.FixtureRequest) -> tuple[dict[str, str] | None, dict[str, Any]]:
    """(environment, config overrides) for the embedded store or real Redis + PostgreSQL."""
    if store == "embedded":
        return None, {}
    env, settings = shared(request.getfixturevalue("services"))
    return env, {"store": settings}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


async def burst(url: str, key: str, count: int) -> list[int]:
    """``count`` requests in flight at once, each on its own connection (so the kernel spreads them)."""
    connector = aiohttp.TCPConnector(limit=count, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=90)) as session:

        async def one() -> int:
            async with session.post(f"{url}/v1/messages", json=BODY, headers=headers(key)) as response:
                await response.read()
                return response.status

        return await asyncio.gather(*(one() for _ in range(count)))


# --- hard caps and rates --------------------------------------------------------------------


@pytest.mark.parametrize("store", ["embedded", "shared"])
def test_a_hard_cap_holds_with_four_workers_and_300_concurrent_requests(
    store: str, tmp_path: Path, fresh_gateway: Any, fakes: Fakes, request: pytest.FixtureRequest
) -> None:
    team = unique_team()
    env, overrides = on_store(store, request)
    gateway = with_workers(fresh_gateway, 4, bundle=metered_bundle(tmp_path / "b", team, budget_cap(team, "1.00", "CalendarMonth")), env=env, **overrides)
    key = gateway.key(team, env=env)
    # Every admitted call is still in flight when the last request arrives (the providers read for 3 s):
    # $1.00 holds 20 bounds of $0.05.
    fakes.anthropic_us.script(METERED_UPSTREAM, *[Reply(delay=2.5) for _ in range(300)])

    counts = collections.Counter(asyncio.run(burst(gateway.url, key, 300)))

    assert counts == {200: 20, 402: 280}, dict(counts)
    assert len(fakes.anthropic_us.requests_for(METERED_UPSTREAM)) == 20
    if store == "embedded":
        with sqlite3.connect(gateway.directory / "state.db") as ledger:
            rows = ledger.execute("SELECT state, cost_micro_usd FROM reservations WHERE team = ?", (team,)).fetchall()
    else:
        rows = [(state, cost) for _, state, _, cost in ledger_rows(request.getfixturevalue("services"), team)]
    assert len(rows) == 20 and {state for state, _ in rows} == {"settled"}
    assert sum(cost for _, cost in rows) == 20 * ACTUAL
    served = [len({r["request_id"] for r in records if "request_id" in r}) for records in records_by_worker(gateway)]
    print(f"\n300 requests over 4 workers: {served} each")
    assert sum(served) == 300 and sum(1 for n in served if n) >= 2  # several workers took part
    for path in chains(gateway):
        assert subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("store", ["embedded", "shared"])
def test_a_rate_admits_exactly_its_rpm_over_four_workers(store: str, tmp_path: Path, fresh_gateway: Any, fakes: Fakes, request: pytest.FixtureRequest) -> None:
    team = unique_team()
    rules = {f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 25}}}
    env, overrides = on_store(store, request)
    gateway = with_workers(fresh_gateway, 4, bundle=metered_bundle(tmp_path / "b", team, rules), env=env, **overrides)
    key = gateway.key(team, env=env)
    away_from_minute_edge(margin=10)
    counts = collections.Counter(asyncio.run(burst(gateway.url, key, 300)))
    assert counts == {200: 25, 429: 275}, dict(counts)


# --- state the embedded store hosts in the supervisor -------------------------------------------


def test_auth_throttling_counts_failures_spread_over_workers(fresh_gateway: Any) -> None:
    gateway = with_workers(fresh_gateway, 4, auth={"max_failures": 8})
    statuses = []
    for _ in range(24):  # a new connection each: the kernel hands them to different workers
        statuses.append(httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers("pk-guessed-wrong")).status_code)
    assert statuses == [401] * 8 + [429] * 16  # per worker, four workers would have allowed 32 guesses


def test_a_pii_restore_that_lands_on_another_worker_works(tmp_path: Path, fresh_gateway: Any, fakes: Fakes) -> None:
    gateway = with_workers(fresh_gateway, 4, bundle=pii_bundle(tmp_path / "b"))
    session = {**headers(gateway.key("eng", "alice")), "x-portcullis-session-id": "conv-workers"}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10}
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="ok"), *[Reply(text="Your contact is <EMAIL_1>.") for _ in range(40)])
    first = httpx.post(f"{gateway.url}/v1/messages", json={**body, "messages": [{"role": "user", "content": f"remember {EMAIL}"}]}, headers=session)
    assert first.status_code == 200
    assert fakes.anthropic_us.received[0].json["messages"][0]["content"] == "remember <EMAIL_1>"
    assigned_by = worker_of(gateway, first.headers["x-portcullis-request-id"])
    restored_by = set()
    for _ in range(40):  # until one lands elsewhere; each must restore
        answer = httpx.post(f"{gateway.url}/v1/messages", json={**body, "messages": [{"role": "user", "content": "who was it?"}]}, headers=session)
        assert answer.status_code == 200 and answer.json()["content"][0]["text"] == f"Your contact is {EMAIL}."
        restored_by.add(worker_of(gateway, answer.headers["x-portcullis-request-id"]))
        if restored_by - {assigned_by}:
            break
    assert restored_by - {assigned_by}, "every request landed on the worker that assigned the placeholder"


# --- signals, deaths and start-up ---------------------------------------------------------------


def test_sigterm_drains_every_worker_and_records_outcomes(fresh_gateway: Any, fakes: Fakes) -> None:
    gateway = with_workers(fresh_gateway, 4)
    key = gateway.key("eng")
    fakes.anthropic_us.script("claude-sonnet-4-5-20250929", *[Reply(delay=1.5) for _ in range(12)])
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    statuses: list[int] = []

    async def fire() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:

            async def one() -> int:
                async with session.post(f"{gateway.url}/v1/messages", json=body, headers=headers(key)) as response:
                    await response.read()
                    return response.status

            statuses.extend(await asyncio.gather(*(one() for _ in range(12))))

    firing = threading.Thread(target=lambda: asyncio.run(fire()))
    firing.start()
    assert wait_for(lambda: len(fakes.anthropic_us.requests_for("claude-sonnet-4-5-20250929")) == 12, timeout=10)
    gateway.signal(signal.SIGTERM)
    firing.join(timeout=30)
    assert gateway.process is not None and gateway.process.wait(timeout=30) == 0
    assert statuses == [200] * 12  # drained, not cut
    every = records_by_worker(gateway)
    assert all(records[-1]["event"] == "gateway_stopped" and records[-1]["signal"] == "SIGTERM" for records in every)
    started = {r["request_id"] for records in every for r in records if r["event"] == "request_started"}
    closed = {r["request_id"] for records in every for r in records if r["event"] in OUTCOME_EVENTS}
    assert len(started) == 12 and started <= closed
    assert "every worker has stopped" in gateway.logs()


def test_a_killed_worker_is_replaced(fresh_gateway: Any) -> None:
    gateway = with_workers(fresh_gateway, 3)
    before = worker_pids(gateway)
    assert len(before) == 3
    victim = sorted(before)[1]
    subprocess.run(["kill", "-KILL", str(victim)], check=True)
    assert wait_for(lambda: "replaced" in gateway.logs(), timeout=30), gateway.logs()
    after = worker_pids(gateway)
    assert len(after) == 3 and victim not in after and len(before & after) == 2
    assert "exited unexpectedly with status -9" in gateway.logs()
    for _ in range(6):
        assert httpx.get(f"{gateway.url}/readyz").status_code == 200


def test_the_supervisor_is_small_and_its_death_stops_the_workers(fresh_gateway: Any) -> None:
    gateway = with_workers(fresh_gateway, 2)
    assert gateway.process is not None
    supervisor = gateway.process.pid
    loaded = Path(f"/proc/{supervisor}/maps").read_text()
    assert not any(heavy in loaded for heavy in ("regorus", "presidio", "tiktoken", "spacy"))
    rss_kb = int(next(line for line in Path(f"/proc/{supervisor}/status").read_text().splitlines() if line.startswith("VmRSS")).split()[1])
    assert rss_kb < 90 * 1024, f"supervisor RSS {rss_kb} kB"
    workers = worker_pids(gateway)
    gateway.process.kill()  # no signal is forwarded: the workers see their state channel close
    gateway.process.wait()
    assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=30)
    assert all(records[-1]["event"] == "gateway_stopped" for records in records_by_worker(gateway))


def test_sighup_reloads_every_worker(tmp_path: Path, fresh_gateway: Any) -> None:
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    gateway = with_workers(fresh_gateway, 3, bundle=bundle, policy={"watch_interval_seconds": 0})
    write_bundle(bundle, revision="r2")
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: gateway.logs().count("bundle reload (SIGHUP): revision 'r1' -> 'r2'") == 3, timeout=15), gateway.logs()
    assert {httpx.get(f"{gateway.url}/readyz").json()["bundle"]["revision"] for _ in range(12)} == {"r2"}


def test_a_bad_bundle_stops_start_up_with_the_single_process_message(tmp_path: Path, fresh_gateway: Any) -> None:
    bundle = write_bundle(tmp_path / "bundle")
    (bundle / "portcullis" / "decision.rego").write_text("package portcullis\n\ndecision := {")
    with pytest.raises(RuntimeError) as one:
        fresh_gateway(bundle=bundle)
    with pytest.raises(RuntimeError) as several:
        fresh_gateway(bundle=bundle, workers=3)
    message = next(line for line in str(one.value).splitlines() if line.startswith("portcullis: policy bundle"))
    assert "gateway exited with 1" in str(one.value) and "gateway exited with 1" in str(several.value)
    assert str(several.value).count("portcullis: policy bundle") == 1  # printed once, by the supervisor
    assert message.replace("gw0", "gw1") in str(several.value)


def test_a_configuration_error_in_a_worker_is_reported_once_with_its_status(fresh_gateway: Any) -> None:
    settings = {"vault": {"key_env": "WORKERS_TEST_VAULT_KEY"}}
    env = {"WORKERS_TEST_VAULT_KEY": "too-short"}  # read when the runtime is built, in each worker
    with pytest.raises(RuntimeError) as one:
        fresh_gateway(pii=settings, env=env)
    with pytest.raises(RuntimeError) as several:
        fresh_gateway(pii=settings, env=env, workers=3)
    line = "portcullis: configuration error: pii.vault.key_env: the vault key must be 32 bytes, hex or base64 encoded"
    assert "gateway exited with 2" in str(one.value) and line in str(one.value)
    assert "gateway exited with 2" in str(several.value) and str(several.value).count(line) == 1


def test_the_demo_key_text_is_printed_once(tmp_path: Path, fakes: Fakes) -> None:
    config = gateway_config(tmp_path, fakes, write_bundle(tmp_path / "bundle"), workers=3)
    port = free_port()
    config["listen"] = {"host": "127.0.0.1", "port": port}
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "out.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path), "--demo-key", "eng/alice"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "FAKE_UPSTREAM_KEY": UPSTREAM_KEY},
    )
    try:
        assert wait_for(lambda: "3 workers serving" in (tmp_path / "out.log").read_text(), timeout=40)
        output = (tmp_path / "out.log").read_text()
        assert output.count("Portcullis is ready on") == 1
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
