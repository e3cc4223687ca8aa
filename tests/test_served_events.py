"""Operational events from a running gateway to an operator's webhook: budget thresholds
crossed, bundles activated and refused, each signed (Standard Webhooks), derived from
the audit record and carrying nothing of the request's content. Tool-call denials are in
test_served_integrity; the mapping of every record kind in test_unit_audit_events."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from portcullis.adapters.events.signing import generate_secret, parse_secret, verify
from tests.bundles import write_bundle
from tests.conftest import Fakes, WebhookReceiver, free_port, wait_for
from tests.governance_helpers import BODY, metered_bundle, unique_team
from tests.metrics_helpers import only, value

pytestmark = pytest.mark.served

SECRET_ENV = "TEST_EVENTS_SECRET"


def events_config(url: str, *types: str) -> dict:
    return {"webhooks": [{"name": "ops", "url": url, "secret_env": SECRET_ENV, **({"events": list(types)} if types else {})}]}


def delivered(receiver: WebhookReceiver, secret: str, event_type: str) -> list[dict]:
    """The events of one type, each checked to carry a valid signature."""
    found = [d for d in receiver.received if d["body"]["type"] == event_type]
    for delivery in found:
        assert verify(parse_secret(secret), delivery["headers"], delivery["raw"], int(time.time())), "a delivery without a valid signature"
    return [d["body"]["data"] for d in found]


def test_budget_thresholds_crossed_are_delivered_once_each(tmp_path: Path, fresh_gateway, fakes: Fakes, webhook_receiver: WebhookReceiver) -> None:
    team, secret = unique_team(), generate_secret()
    rules = {f"{team}-month": {"subject": {"team": team}, "budget": {"limit_usd": "0.10", "period": "CalendarMonth", "thresholds": [1, 2]}}}
    gateway = fresh_gateway(
        bundle=metered_bundle(tmp_path / "b", team, rules),
        events=events_config(webhook_receiver.url, "budget.threshold_crossed"),
        env={SECRET_ENV: secret},
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team), max_retries=0)
    for _ in range(3):
        client.messages.create(**BODY)
    assert wait_for(lambda: len(webhook_receiver.received) >= 2)
    crossed = delivered(webhook_receiver, secret, "budget.threshold_crossed")
    records = [r for r in gateway.settled() if r["event"] == "budget_threshold"]
    assert [event["threshold"] for event in crossed] == [1, 2] == [r["threshold"] for r in records]
    assert {event["request_id"] for event in crossed} == {r["request_id"] for r in records}
    assert crossed[0]["scope"] == f"team:{team}" and crossed[0]["period"] == time.strftime("M%Y-%m", time.gmtime())
    assert len(webhook_receiver.received) == 2  # nothing but the type this webhook asked for


def test_bundle_activations_and_refusals_are_delivered(tmp_path: Path, fresh_gateway, webhook_receiver: WebhookReceiver) -> None:
    secret = generate_secret()
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    port = free_port()
    gateway = fresh_gateway(
        bundle=bundle,
        policy={"watch_interval_seconds": 0},
        events=events_config(webhook_receiver.url),
        telemetry={"metrics": {"listen": {"host": "127.0.0.1", "port": port}}},
        env={SECRET_ENV: secret},
    )
    write_bundle(bundle, revision="r2")
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: delivered(webhook_receiver, secret, "bundle.activated"))
    write_bundle(bundle, revision="r3", extra={"portcullis/own_test.rego": "package portcullis\n\ntest_always_fails if false\n"})
    gateway.signal(signal.SIGHUP)
    assert wait_for(lambda: delivered(webhook_receiver, secret, "bundle.refused"))

    [activated] = delivered(webhook_receiver, secret, "bundle.activated")
    assert activated["previous_revision"] == "r1" and activated["revision"] == "r2" and activated["trigger"] == "SIGHUP"
    assert len(activated["digest"]) == 64
    [refused] = delivered(webhook_receiver, secret, "bundle.refused")
    assert refused["serving_revision"] == "r2" and "own policy tests fail: data.portcullis.test_always_fails" in refused["reason"]
    records = {r["event"]: r for r in gateway.audit_records()}
    assert records["bundle_activated"]["revision"] == "r2" and records["bundle_refused"]["serving_revision"] == "r2"
    ids = [d["headers"]["webhook-id"] for d in webhook_receiver.received]
    assert len(set(ids)) == len(ids)  # one message id per event
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert value(metrics, "portcullis_events_deliveries_total", webhook="ops", result="delivered") == 2
    assert only(metrics, "portcullis_events_deliveries_total", webhook="ops", result="failed") == 0
    assert only(metrics, "portcullis_events_queued", webhook="ops") == 0 and webhook_receiver.url not in metrics
