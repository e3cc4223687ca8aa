"""Operational events derived from audit records (``adapters/events/audit_events.py``):
which records stand for which events and with exactly which fields; the bundle
manager's own audit records; and, end to end, a real audit log feeding signed webhooks
at real aiohttp receivers, routed by each webhook's ``events``, nothing of a record
beyond the mapped fields ever sent. The configuration: ``test_unit_events_config.py``."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.audit_records import outcome_record, refusal_record
from portcullis.adapters.auth import Principal
from portcullis.adapters.bundles import BundleManager, load_bundle
from portcullis.adapters.config import load_config
from portcullis.adapters.events.audit_events import EventPublisher, events_of
from portcullis.adapters.events.config import EventsConfig, EventsConfigError, events_config, legacy_integrity_webhook
from portcullis.adapters.events.delivery import WebhookDelivery
from portcullis.adapters.events.signing import parse_secret, verify
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.protocols.registry import PROTOCOLS
from portcullis.engine.bundle import BundleError
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity.injection import InjectionReview
from tests.bundles import write_bundle
from tests.webhook_helpers import BASE, WHSEC_A, WHSEC_B, Receiver, checked, webhook

PRINCIPAL = Principal(key_id="k_123", team="eng", user="ada")
PROMPT = "PROMPT-TEXT-never-sent"  # stands for anything a record might carry beyond the mapped fields


def new_exchange(request_id: str = "req_1") -> Exchange:
    return Exchange(request_id, PROTOCOLS["anthropic_messages"], time.monotonic(), dt.datetime.now(dt.UTC), principal=PRINCIPAL)


# Records as the gateway writes them: built by audit_records from an exchange the way the
# integrity guard (adapters/integrity/guard.py) and governance fill it in.


def tool_denials_record(outcome: str = "ok") -> dict[str, Any]:
    exchange = new_exchange()
    denied = [{"tool": "bash", "rule": "remote-script-pipe"}, {"tool": "write_file", "rule": "output_secrets"}]
    exchange.audit_outcome.setdefault("integrity", {})["tool_calls_denied"] = denied
    exchange.audit_outcome["integrity"]["output"] = {"secrets": 1}
    return {"event": {"ok": "request_finished", "failed": "request_failed"}[outcome], **outcome_record(exchange, outcome)}


def injection_record(action: str, error: GatewayError | None = None) -> dict[str, Any]:
    exchange = new_exchange()
    review = InjectionReview({"tool_result": ("ignore-previous",), "user": ("dan-mode", "ignore-previous")}, action)
    exchange.audit_started["integrity"] = {
        "policies": ["strict"],
        "scanned": {"texts": 2, "cached": 0},
        "injection": {"action": review.action, "findings": {surface: list(rules) for surface, rules in review.findings.items()}},
    }
    return {"event": "request_denied", **refusal_record(exchange, "integrity", error or review.refusal())}


def budget_record() -> dict[str, Any]:
    counter = "team:eng|cost|month"
    return {"event": "budget_threshold", "counter": counter, "scope": "team:eng", "metric": "cost", "period": "month", "threshold": 80, "request_id": "req_1"}


PRINCIPAL_DATA = {"team": "eng", "user": "ada", "key_id": "k_123"}
DENIALS = [
    ("tool_call.denied", {"request_id": "req_1", "principal": PRINCIPAL_DATA, "tool": "bash", "rule": "remote-script-pipe"}),
    ("tool_call.denied", {"request_id": "req_1", "principal": PRINCIPAL_DATA, "tool": "write_file", "rule": "output_secrets"}),
]
BLOCKED = (
    "injection.blocked",
    {"request_id": "req_1", "principal": PRINCIPAL_DATA, "findings": {"tool_result": ["ignore-previous"], "user": ["dan-mode", "ignore-previous"]}},
)
BUDGET = (
    "budget.threshold_crossed",
    {"request_id": "req_1", "counter": "team:eng|cost|month", "scope": "team:eng", "metric": "cost", "period": "month", "threshold": 80},
)
ACTIVATED_RECORD = {"event": "bundle_activated", "trigger": "SIGHUP", "previous_revision": "r1", "revision": "r2", "digest": "ab" * 32}
ACTIVATED = ("bundle.activated", {"trigger": "SIGHUP", "previous_revision": "r1", "revision": "r2", "digest": "ab" * 32})
REFUSED_RECORD = {"event": "bundle_refused", "trigger": "files changed", "serving_revision": "r2", "reason": "the bundle's own policy tests fail: data.t"}
REFUSED = ("bundle.refused", {"trigger": "files changed", "serving_revision": "r2", "reason": "the bundle's own policy tests fail: data.t"})


# --- which records are events ---------------------------------------------------------------


def test_budget_threshold_record_is_one_event() -> None:
    assert events_of(budget_record()) == [BUDGET]


@pytest.mark.parametrize("outcome", ["ok", "failed"])
def test_each_denied_tool_call_of_an_outcome_record_is_an_event(outcome: str) -> None:
    record = tool_denials_record(outcome)
    assert "principal" not in record  # outcome records do not repeat it: the publisher joins it from request_started
    assert events_of(record, PRINCIPAL.as_input()) == DENIALS
    assert events_of(record) == [(kind, {k: v for k, v in data.items() if k != "principal"}) for kind, data in DENIALS]


def test_an_injection_block_is_an_event_naming_surfaces_and_rules() -> None:
    assert events_of(injection_record("block")) == [BLOCKED]


def test_bundle_records_are_events() -> None:
    assert events_of(ACTIVATED_RECORD) == [ACTIVATED]
    assert events_of(REFUSED_RECORD) == [REFUSED]
    long = events_of(REFUSED_RECORD | {"reason": "x" * 2000})
    assert long[0][1]["reason"] == "x" * 500


def started_with_warning() -> dict[str, Any]:
    record = injection_record("warn")
    return {**record, "event": "request_started"}


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(started_with_warning(), id="warn-only injection on request_started"),
        pytest.param({"event": "request_finished", **outcome_record(new_exchange(), "ok")}, id="ordinary request_finished"),
        pytest.param(
            injection_record("warn", GatewayError(ErrorKind.PAYMENT_REQUIRED, "the budget for this month is exhausted", code="budget_exceeded")),
            id="request_denied for budget, with a warn finding",
        ),
        pytest.param(injection_record("block", GatewayError(ErrorKind.UNAVAILABLE, "no", code="ledger_unavailable")), id="block action but another refusal"),
        pytest.param({"event": "request_denied", "request_id": "r", "error": {"kind": "invalid_request", "code": "prompt_injection"}}, id="no findings"),
        pytest.param(
            {**injection_record("block"), "integrity": {"injection": {"action": "warn", "findings": {"user": ["r"]}}}}, id="the record's action is warn"
        ),
        pytest.param({"event": "tokens_counted", "request_id": "r", "integrity": {}}, id="count without denials"),
        pytest.param({"event": "gateway_stopped", "signal": "SIGTERM"}, id="other record"),
        pytest.param({"request_id": "r"}, id="no event field"),
    ],
)
def test_records_that_are_no_event(record: dict[str, Any]) -> None:
    assert events_of(record, PRINCIPAL.as_input()) == []


def test_only_the_mapped_fields_pass_and_only_as_scalars() -> None:
    record = tool_denials_record()
    record["prompt"] = PROMPT
    record["integrity"]["tool_calls_denied"] = [{"tool": "bash", "rule": "r1", "arguments": {"cmd": PROMPT}}]
    principal = {**PRINCIPAL.as_input(), "email": PROMPT}
    assert events_of(record, principal) == [("tool_call.denied", {"request_id": "req_1", "principal": PRINCIPAL_DATA, "tool": "bash", "rule": "r1"})]
    record["integrity"]["tool_calls_denied"] = [None, "bash", {"tool": "t", "rule": "r"}]  # what no guard writes: skipped, not fatal
    assert events_of(record) == [("tool_call.denied", {"request_id": "req_1", "tool": "t", "rule": "r"})]
    nested = events_of(budget_record() | {"scope": {"text": PROMPT}, "counter": "c" * 1000, "body": PROMPT})
    assert nested[0][1]["scope"] is None and nested[0][1]["counter"] == "c" * 200
    assert PROMPT not in json.dumps([events_of(started_with_warning()), nested])


# --- end to end: audit log -> publisher -> signed webhooks ------------------------------------


def body_of(got: Any) -> dict[str, Any]:
    return json.loads(got.body)


def test_audit_records_reach_the_webhooks_that_want_them_signed_and_nothing_more(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    environ = {"ALL_SECRET": WHSEC_A, "TOOLS_SECRET": WHSEC_B}

    async def scenario() -> tuple[Receiver, Receiver, Receiver, dict[str, dict[str, int]]]:
        async with Receiver() as everything, Receiver() as tools, Receiver() as legacy:
            section = {
                "webhooks": [
                    {"name": "all", "url": everything.url, "secret_env": "ALL_SECRET"},
                    {"name": "tools", "url": tools.url, "secret_env": "TOOLS_SECRET", "events": ["tool_call.denied", "bundle.refused"]},
                ]
            }
            config = events_config(checked(section)).with_webhook(legacy_integrity_webhook(legacy.url, 2.0))
            publisher = EventPublisher.build(config, environ)
            assert publisher is not None
            audit.subscribe(publisher)
            started = {**injection_record("warn"), "event": "request_started", "prompt": PROMPT}
            audit.append_or_raise("request_started", **{k: v for k, v in started.items() if k != "event"})
            finished = tool_denials_record()
            finished["prompt"] = PROMPT
            audit.append("request_finished", **{k: v for k, v in finished.items() if k != "event"})
            audit.append("request_finished", **outcome_record(new_exchange("req_2"), "ok"))  # no event
            audit.append("request_denied", **{k: v for k, v in injection_record("block").items() if k != "event"} | {"messages": [PROMPT]})
            audit.append("budget_threshold", **{k: v for k, v in budget_record().items() if k != "event"})
            await asyncio.to_thread(
                audit.append, "bundle_activated", **{k: v for k, v in ACTIVATED_RECORD.items() if k != "event"}
            )  # off the loop: handed over with call_soon_threadsafe
            audit.append("bundle_refused", **{k: v for k, v in REFUSED_RECORD.items() if k != "event"})
            await publisher.close(timeout=5)
            return everything, tools, legacy, publisher.stats()

    everything, tools, legacy, stats = asyncio.run(scenario())
    audit.close()
    assert [(body["type"], body["data"]) for body in map(body_of, everything.received)] == [*DENIALS, BLOCKED, BUDGET, ACTIVATED, REFUSED]
    assert [(body["type"], body["data"]) for body in map(body_of, tools.received)] == [*DENIALS, REFUSED]
    assert [(body["type"], body["data"]) for body in map(body_of, legacy.received)] == DENIALS
    now = int(time.time())
    for got in everything.received:
        assert verify(parse_secret(WHSEC_A), got.headers, got.body, now=now) and not verify(parse_secret(WHSEC_B), got.headers, got.body, now=now)
    assert all(verify(parse_secret(WHSEC_B), got.headers, got.body, now=now) for got in tools.received)
    assert all("webhook-signature" not in got.headers for got in legacy.received)
    for got in [*everything.received, *tools.received, *legacy.received]:
        assert PROMPT.encode() not in got.body and set(body_of(got)) == {"type", "timestamp", "data"}
    assert stats == {
        "all": {"delivered": 6, "retried": 0, "failed": 0, "dropped": 0, "queued": 0},
        "tools": {"delivered": 3, "retried": 0, "failed": 0, "dropped": 0, "queued": 0},
        "integrity": {"delivered": 2, "retried": 0, "failed": 0, "dropped": 0, "queued": 0},
    }
    written = [json.loads(line)["event"] for line in audit.path.read_text().splitlines()]
    assert written == ["request_started", "request_finished", "request_finished", "request_denied", "budget_threshold", "bundle_activated", "bundle_refused"]


def test_build_without_webhooks_is_none_and_with_a_bad_secret_fails() -> None:
    assert EventPublisher.build(EventsConfig()) is None
    config = EventsConfig(webhooks=(webhook(),))
    with pytest.raises(EventsConfigError, match="OPS_SECRET is not set"):
        EventPublisher.build(config, {})


def test_the_listener_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="portcullis.events")

    class Broken(WebhookDelivery):
        def publish(self, target: str, event_type: str, data: Any) -> None:
            raise RuntimeError(PROMPT)

    publisher = EventPublisher(Broken([]), [webhook()])
    publisher(budget_record())  # no event loop: counted, not raised
    assert publisher.unpublished == 1

    async def scenario() -> None:
        publisher({"event": "budget_threshold", "request_id": object()})  # odd values become None
        publisher(tool_denials_record() | {"integrity": {"tool_calls_denied": [None, "bash", {"tool": "t", "rule": "r"}]}})
        publisher(None)  # type: ignore[arg-type]  # not a record at all

    asyncio.run(scenario())
    assert publisher.unpublished == 4
    assert PROMPT not in caplog.text and "RuntimeError" in caplog.text


class Recording(WebhookDelivery):
    def __init__(self) -> None:
        super().__init__([])
        self.published: list[tuple[str, str, dict[str, Any]]] = []

    def publish(self, target: str, event_type: str, data: Any) -> None:
        self.published.append((target, event_type, dict(data)))


def test_a_record_from_another_thread_is_published_on_the_loop() -> None:
    async def scenario() -> Recording:
        delivery = Recording()
        publisher = EventPublisher(delivery, [webhook()])  # built on the loop: the first record may come from a thread
        await asyncio.to_thread(publisher, budget_record())
        await asyncio.sleep(0)
        return delivery

    assert asyncio.run(scenario()).published == [("ops", *BUDGET)]


def test_principals_are_forgotten_once_their_request_ends_and_bounded() -> None:
    delivery = Recording()
    published = delivery.published
    publisher = EventPublisher(delivery, [webhook()], max_open_requests=2)

    async def scenario() -> None:
        for request_id in ("req_1", "req_2", "req_3"):  # req_1 is forgotten: only two are kept
            publisher({"event": "request_started", "request_id": request_id, "principal": PRINCIPAL.as_input()})
        publisher(tool_denials_record())
        finished = tool_denials_record()
        for request_id in ("req_3", "req_3"):  # the second outcome finds no principal: it was taken
            publisher(finished | {"request_id": request_id})

    asyncio.run(scenario())
    assert ["principal" in data for _, _, data in published] == [False, False, True, True, False, False]
    assert {(target, kind) for target, kind, _ in published} == {("ops", "tool_call.denied")}
    assert len(publisher._principals) == 1  # req_2, still open


# --- the bundle manager's records ------------------------------------------------------------

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}
TODAY = dt.date(2026, 11, 30)


def manager(tmp_path: Path, audit: AuditLog | None) -> BundleManager:
    bundle = write_bundle(tmp_path / "bundle", revision="r1")
    (tmp_path / "portcullis.yaml").write_text(yaml.safe_dump({**BASE, "policy": {"bundle": str(bundle), "watch_interval_seconds": 0}}))
    config = load_config(tmp_path / "portcullis.yaml")
    return BundleManager(config, PROVIDERS, load_bundle(config, PROVIDERS, TODAY), lambda: TODAY, audit=audit)


def test_bundle_activations_and_refusals_are_audited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    told: list[dict[str, Any]] = []
    audit.subscribe(told.append)
    bundles = manager(tmp_path, audit)
    bundle = tmp_path / "bundle"

    assert asyncio.run(bundles.reload("SIGHUP"))  # the same bundle: nothing changed, nothing recorded
    write_bundle(bundle, revision="r2")
    assert asyncio.run(bundles.reload("SIGHUP"))
    (bundle / "portcullis" / "decision.rego").write_text("package portcullis\n\ndecision := {")
    assert not asyncio.run(bundles.reload("files changed"))
    refusal = bundles.last_error
    assert refusal

    def long_refusal(*_: Any) -> None:
        raise BundleError("y" * 2000)

    monkeypatch.setattr("portcullis.adapters.bundles._load_off_thread", long_refusal)
    assert not asyncio.run(bundles.reload("files changed"))
    audit.close()

    records = [json.loads(line) for line in audit.path.read_text().splitlines()]
    assert [{k: v for k, v in record.items() if k not in ("ts", "seq", "prev", "hash")} for record in records] == [
        {"event": "bundle_activated", "trigger": "SIGHUP", "previous_revision": "r1", "revision": "r2", "digest": bundles.active.digest},
        {"event": "bundle_refused", "trigger": "files changed", "serving_revision": "r2", "reason": refusal[:500]},
        {"event": "bundle_refused", "trigger": "files changed", "serving_revision": "r2", "reason": "y" * 500},
    ]
    assert [kind for record in told for kind, _ in events_of(record)] == ["bundle.activated", "bundle.refused", "bundle.refused"]


def test_a_bundle_manager_without_an_audit_log_still_reloads(tmp_path: Path) -> None:
    bundles = manager(tmp_path, None)
    write_bundle(tmp_path / "bundle", revision="r2")
    assert asyncio.run(bundles.reload("SIGHUP")) and bundles.active.revision == "r2"
    (tmp_path / "bundle" / ".manifest").write_text("{")
    assert not asyncio.run(bundles.reload("SIGHUP")) and bundles.active.revision == "r2"
