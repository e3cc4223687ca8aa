"""Governance end to end when things break: killed processes, cut streams, Redis that
loses its counters or goes away; nothing is lost and hard caps fail closed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import Fakes, Services, private_redis
from tests.fakes import CutStream, Reply
from tests.governance_helpers import ACTUAL, BODY, BOUND, METERED_UPSTREAM, budget_cap, headers, ledger_rows, metered_bundle, shared, unique_team

pytestmark = pytest.mark.served


# --- failures: killed processes, cut streams, Redis lost or gone ------------------------------------


def test_killed_process_leaves_an_open_reservation_that_reconcile_resolves(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarMonth")
    env, store = shared(services)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(text="a slow answer in many parts", event_delay=1.0))
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key), timeout=30) as response:
        assert next(response.iter_lines()).startswith("event: message_start")
        gateway.signal(signal.SIGKILL)
        gateway.process.wait()
    [(reservation_id, state, _, cost)] = ledger_rows(services, team)
    assert state == "open" and cost == BOUND
    reconciled = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--older-than", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert reconciled.returncode == 0, reconciled.stderr
    assert f"{reservation_id}  was open  charged {BOUND} micro-USD" in reconciled.stdout
    assert ledger_rows(services, team)[0][1] == "reconciled"
    again = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--older-than", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert "reconciled 0 reservations" in again.stdout


def test_cut_stream_stays_charged_until_reconciled_with_provider_usage(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.10", "CalendarMonth")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    key = gateway.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, CutStream(after=4))
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key)) as response:
        request_id = response.headers["x-portcullis-request-id"]
        assert "event: error" in response.read().decode()
    outcome = gateway.outcome(request_id)
    assert outcome["event"] == "request_failed" and outcome["settlement"] == "pending"
    # The bound ($0.05) stays charged: one more bound fits under $0.10, a second does not.
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 402
    usage = tmp_path / "usage.jsonl"
    usage.write_text(json.dumps({"request_id": request_id, "input": 10, "output": 30}) + "\n")
    reconciled = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "ledger", "reconcile", "--config", str(gateway.config_path), "--usage", str(usage)],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_UPSTREAM_KEY": "x"},
        timeout=60,
    )
    assert f"{request_id}  was pending  charged 1500 micro-USD  (usage from the provider's records)" in reconciled.stdout
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200  # the bound was released


def test_counters_come_back_from_the_ledger_after_redis_loses_them(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    team = unique_team()
    rules = budget_cap(team, "0.07", "CalendarMonth")
    prefix = f"{services.redis_prefix}{team}:"
    env, store = shared(services, redis_prefix=prefix)
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store=store)
    key = gateway.key(team, env=env)
    post = lambda: httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code  # noqa: E731
    statuses = [post() for _ in range(22)]
    assert statuses[:21] == [200] * 21 and statuses[21] == 402  # $0.021 spent: one more $0.05 bound no longer fits
    import redis

    client = redis.Redis.from_url(services.redis_url)
    lost = [k for k in client.scan_iter(match=f"{prefix}counter:*")]
    assert lost and client.delete(*lost) == len(lost)  # as if Redis had been flushed
    assert post() == 402  # reloaded from PostgreSQL, not restarted from zero


def test_unreachable_redis_fails_hard_caps_closed_and_loses_nothing(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    with private_redis() as redis_url:
        capped, free = unique_team(), unique_team()
        rules = {f"{capped}-cap": {"subject": {"team": capped}, "budget": {"limit_usd": "5", "period": "CalendarMonth"}}}
        env = {"DATABASE_URL": services.database_url, "REDIS_URL": redis_url}
        gateway = fresh_gateway(
            bundle=metered_bundle(tmp_path / "b", capped, rules, extra_teams=(free,)), env=env, store={"kind": "shared"}, auth={"key_cache_seconds": 300}
        )
        capped_key, free_key = gateway.key(capped, env=env), gateway.key(free, env=env)
        for key in (capped_key, free_key):  # verified once, while Redis is up
            assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(key)).status_code == 200
    refused = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(capped_key))
    assert refused.status_code == 503 and "limits cannot be checked" in refused.json()["error"]["message"]
    served = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(free_key))
    assert served.status_code == 200
    assert [row[1:] for row in ledger_rows(services, free)] == [("settled", 120, ACTUAL), ("settled", 120, ACTUAL)]  # recorded all the same
    assert len(ledger_rows(services, capped)) == 1
