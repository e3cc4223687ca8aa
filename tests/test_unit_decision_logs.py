"""Decision logs (``engine/decision_log.py``, ``adapters/decision_logs/``): the OPA event a
real decision becomes, masking by JSON pointer (OPA's remove), deterministic sampling,
the file sink's lines, and the HTTP sink against a real aiohttp receiver (gzip JSON
arrays, retries, a bounded buffer). Served end to end: ``test_served_decision_logs.py``."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from portcullis.adapters.audit_records import refusal_record, started_record
from portcullis.adapters.auth import Principal
from portcullis.adapters.decision_logs.config import DecisionLogsConfig, DecisionLogsConfigError, FileSinkConfig, HttpSinkConfig, decision_logs_config
from portcullis.adapters.decision_logs.logger import DecisionLogger
from portcullis.adapters.decision_logs.sinks import FileSink, HttpSink
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.policy_input import decide
from portcullis.adapters.protocols.registry import PROTOCOLS
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.adapters.telemetry.registry import Registry
from portcullis.engine import schemas
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.decision_log import PointerError, decision_event, parse_pointer, sampled
from portcullis.engine.errors import ErrorKind, GatewayError
from tests.bundles import write_bundle
from tests.webhook_helpers import BASE, QUERY_TOKEN, Receiver

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}
TODAY = dt.date(2026, 11, 30)
ARRIVED = dt.datetime(2026, 11, 30, 12, 0, 1, 234567, tzinfo=dt.UTC)
PROMPT = "PROMPT-TEXT-never-logged"
LABELS = {"id": "gw-test", "version": "0.0.0", "app": "portcullis"}


@pytest.fixture(scope="module")
def active(tmp_path_factory: pytest.TempPathFactory) -> ActiveBundle:
    directory = write_bundle(tmp_path_factory.mktemp("bundle") / "b", revision="rev-7")
    return activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, TODAY)


def request(model: str = "claude-sonnet-4-5", tools: list[str] | None = None) -> ParsedRequest:
    body = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]}
    return ParsedRequest("anthropic_messages", json.dumps(body).encode(), body, model, False, 64, [], tools=tools or [])


def exchange(active: ActiveBundle, request_id: str = "req_1", user: str | None = "ada", model: str = "claude-sonnet-4-5", decided: bool = True) -> Exchange:
    principal = Principal("k_1", "eng", user)
    parsed = request(model, ["Bash", "Read"])
    made = Exchange(request_id, PROTOCOLS["anthropic_messages"], time.monotonic(), ARRIVED, principal=principal, request=parsed, bundle=active)
    if decided:
        made.plan = decide(active, principal, parsed, {"budget": {"team": 12}})
    return made


def logger(tmp_path: Path | None = None, http: HttpSink | None = None, **settings: Any) -> DecisionLogger:
    file = FileSink(tmp_path / "decisions.jsonl") if tmp_path is not None else None
    config = DecisionLogsConfig(file=FileSinkConfig(file.path) if file else None, **settings)
    return DecisionLogger(config, file, http, LABELS)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the event --------------------------------------------------------------------------------


def test_a_decision_becomes_an_opa_event_with_its_input_and_result(active: ActiveBundle, tmp_path: Path) -> None:
    made = exchange(active)
    plan = made.plan
    assert plan is not None and plan.source is not None and plan.source_input is not None
    event = logger(tmp_path).event(pending_of(made))

    assert set(event) == {"decision_id", "labels", "bundles", "path", "input", "result", "timestamp", "bundle_digest"}
    assert event["decision_id"] == "req_1" and event["path"] == "portcullis/decision"
    assert event["bundles"] == {"portcullis": {"revision": "rev-7"}} and event["bundle_digest"] == active.digest
    assert event["labels"] == LABELS
    assert event["timestamp"] == "2026-11-30T12:00:01.234567000Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", event["timestamp"])
    # The input the policy read: ids, request metadata and facts, never the prompt.
    assert event["input"] == {
        "principal": {"key_id": "k_1", "team": "eng", "user": "ada"},
        "request": {
            "protocol": "anthropic_messages",
            "model": "claude-sonnet-4-5",
            "stream": False,
            "max_tokens": 64,
            "requires": [],
            "tools": ["Bash", "Read"],
        },
        "facts": {"budget": {"team": 12}},
    }
    assert PROMPT not in json.dumps(event)
    # The result as evaluated: the policy's own document, of which the plan is a reading.
    assert event["result"] == plan.source and event["result"]["allow"] is True
    assert event["result"]["model"] == plan.model and len(event["result"]["targets"]) == len(plan.targets)


def test_a_cached_decision_keeps_what_it_was_decided_from(active: ActiveBundle) -> None:
    first, again = exchange(active, "req_a").plan, exchange(active, "req_b").plan
    assert first is again  # the same input: one cached evaluation
    assert again is not None and json.loads(again.source_input or "")["principal"]["user"] == "ada"
    refused = exchange(active, model="claude-sonet-4-5").plan  # a typo: the plan gets suggestions (a replaced copy)
    assert refused is not None and refused.suggestions and refused.source is not None and refused.source["allow"] is False


def pending_of(made: Exchange) -> Any:
    from portcullis.adapters.decision_logs.logger import PendingDecision

    assert made.plan is not None and made.bundle is not None
    return PendingDecision(made.request_id, made.plan.source_input or "", made.plan.source or {}, made.bundle.revision, made.bundle.digest, made.arrived)


# --- masking ----------------------------------------------------------------------------------


def event_masked(*pointers: str, input_document: Any = None, result: Any = None) -> dict[str, Any]:
    document = input_document or {
        "principal": {"user": "ada", "team": "eng", "key_id": "k"},
        "request": {"tools": ["Bash", "Read"], "model": "m"},
        "facts": {"a/b": 1, "t~x": 2, "list": [{"secret": 1, "keep": 2}, {"secret": 3}]},
    }
    return decision_event(
        decision_id="d",
        input_document=document,
        result=result or {"allow": True, "model": "m"},
        revision="r",
        digest="g",
        labels=LABELS,
        timestamp=ARRIVED,
        mask=[parse_pointer(pointer) for pointer in pointers],
    )


def test_masking_removes_what_each_pointer_names_and_lists_it_as_erased() -> None:
    event = event_masked("/input/principal/user", "/input/request/tools", "/input/facts/a~1b", "/input/facts/t~0x", "/input/facts/list/0/secret")
    assert event["input"] == {"principal": {"team": "eng", "key_id": "k"}, "request": {"model": "m"}, "facts": {"list": [{"keep": 2}, {"secret": 3}]}}
    assert event["erased"] == ["/input/principal/user", "/input/request/tools", "/input/facts/a~1b", "/input/facts/t~0x", "/input/facts/list/0/secret"]


def test_masking_a_missing_path_changes_nothing() -> None:
    pointers = ("/input/principal/nobody", "/input/nothing/deeper/still", "/input/principal/user/past_a_string", "/input/facts/list/9", "/input/facts/list/01")
    event = event_masked(*pointers)
    assert event["input"] == event_masked()["input"] and "erased" not in event


def test_masking_whole_sections_and_the_result() -> None:
    event = event_masked("/input/facts", "/result/model")
    assert "facts" not in event["input"] and event["result"] == {"allow": True}
    assert event_masked("/input")["erased"] == ["/input"] and "input" not in event_masked("/input")
    assert event_masked("/input/facts/list/1")["input"]["facts"]["list"] == [{"secret": 1, "keep": 2}]  # an array element, by index


def test_masking_the_result_never_touches_the_cached_plan(active: ActiveBundle, tmp_path: Path) -> None:
    made = exchange(active, user="mask-result")
    assert made.plan is not None and made.plan.source is not None
    before = json.dumps(made.plan.source, sort_keys=True)
    event = logger(tmp_path, mask=(parse_pointer("/result/targets"), parse_pointer("/input/principal/user"))).event(pending_of(made))
    assert "targets" not in event["result"] and "user" not in event["input"]["principal"]
    assert json.dumps(made.plan.source, sort_keys=True) == before


@pytest.mark.parametrize("pointer", ["input/principal", "/request/model", "/input/a~2b", "/", ""])
def test_a_pointer_outside_input_and_result_or_malformed_is_refused(pointer: str) -> None:
    with pytest.raises(PointerError):
        parse_pointer(pointer)


# --- configuration ----------------------------------------------------------------------------


def configured(section: dict[str, Any]) -> DecisionLogsConfig:
    schemas.check("config", {**BASE, "decision_logs": section})
    return decision_logs_config(section, lambda value: Path("/etc/portcullis") / value)


def test_the_section_reads_with_its_defaults_and_is_off_when_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not decision_logs_config(None, Path).enabled
    config = configured({"file": {"path": "decisions.jsonl"}, "mask": ["/input/principal/user"]})
    assert config.enabled and config.file == FileSinkConfig(Path("/etc/portcullis/decisions.jsonl")) and config.http is None
    assert (config.sample_ratio, config.buffer_events, config.flush_seconds, config.max_batch_events) == (1.0, 10_000, 5.0, 500)
    assert config.mask == (("input", "principal", "user"),)
    http = configured({"http": {"url": f"https://logs.example/logs?token={QUERY_TOKEN}", "bearer_token_env": "DL_TOKEN"}}).http
    assert http is not None and (http.timeout_seconds, http.max_attempts) == (5.0, 5) and QUERY_TOKEN not in repr(http)
    monkeypatch.setenv("DL_TOKEN", "tok-123")
    assert http.token() == "tok-123"
    monkeypatch.delenv("DL_TOKEN")
    with pytest.raises(DecisionLogsConfigError, match=r"decision_logs\.http\.bearer_token_env: environment variable DL_TOKEN is not set"):
        http.token()


@pytest.mark.parametrize(
    "section",
    [
        {"sample_ratio": 0.5},  # no sink
        {"file": {"path": "x"}, "sample_ratio": 1.5},
        {"file": {"path": "x"}, "mask": ["/request/model"]},
        {"file": {"path": "x"}, "unknown": 1},
        {"http": {"url": "ftp://x"}},
        {"file": {"path": "x"}, "buffer_events": 0},
    ],
)
def test_the_schema_refuses_what_cannot_work(section: dict[str, Any]) -> None:
    with pytest.raises(schemas.SchemaError):
        schemas.check("config", {**BASE, "decision_logs": section})


def test_settings_that_cannot_work_together_name_the_field() -> None:
    with pytest.raises(DecisionLogsConfigError, match=r"decision_logs.max_batch_events"):
        configured({"file": {"path": "x"}, "buffer_events": 10, "max_batch_events": 20})
    with pytest.raises(DecisionLogsConfigError, match=r"decision_logs.mask\[1\]"):
        configured({"file": {"path": "x"}, "mask": ["/input/a", "/input/b~2"]})


# --- sampling ---------------------------------------------------------------------------------


def test_sampling_is_deterministic_by_decision_id_and_nested_by_ratio() -> None:
    ids = [f"req_{n:05d}" for n in range(4000)]
    quarter = {i for i in ids if sampled(i, 0.25)}
    assert quarter == {i for i in ids if sampled(i, 0.25)}  # a replica, or a replay, picks the same
    assert 850 < len(quarter) < 1150
    assert quarter <= {i for i in ids if sampled(i, 0.5)}  # a larger ratio keeps every decision a smaller one did
    assert all(sampled(i, 1.0) for i in ids) and not any(sampled(i, 0.0) for i in ids)


def test_two_replicas_log_the_same_sample(active: ActiveBundle, tmp_path: Path) -> None:
    async def scenario(directory: Path) -> list[str]:
        replica = logger(directory, sample_ratio=0.3, flush_seconds=0.01)
        for n in range(60):
            replica.finished(exchange(active, f"req_{n}"), "ok")
        await replica.close()
        return [event["decision_id"] for event in lines(directory / "decisions.jsonl")]

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    one, two = asyncio.run(scenario(tmp_path / "a")), asyncio.run(scenario(tmp_path / "b"))
    assert one == two and 5 < len(one) < 40 and one == [f"req_{n}" for n in range(60) if sampled(f"req_{n}", 0.3)]


# --- the file sink ----------------------------------------------------------------------------


def test_the_file_gets_one_line_per_decided_request_appended(active: ActiveBundle, tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_text('{"decision_id": "earlier"}\n')

    async def scenario() -> DecisionLogger:
        running = logger(tmp_path, flush_seconds=0.01, mask=(parse_pointer("/input/principal/user"),))
        running.finished(exchange(active, "req_1"), "ok")
        running.finished(exchange(active, "req_none", decided=False), "refused", GatewayError(ErrorKind.AUTHENTICATION, "no"), "authenticate")
        running.finished(exchange(active, "req_2", user="bob"), "refused", GatewayError(ErrorKind.PERMISSION, "no"), "admit", "pii")
        running.finished(exchange(active, "req_3", model="no-such-model"), "refused", GatewayError(ErrorKind.NOT_FOUND, "no"), "decide")
        await asyncio.sleep(0.2)  # flushed by its timer, before close
        assert [event["decision_id"] for event in lines(path)] == ["earlier", "req_1", "req_2", "req_3"]
        await running.close()
        return running

    running = asyncio.run(scenario())
    written = lines(path)[1:]
    assert all("user" not in event["input"]["principal"] and event["erased"] == ["/input/principal/user"] for event in written)
    assert written[2]["result"]["allow"] is False and written[2]["result"]["reasons"][0]["code"] == "unknown_model"
    assert running.stats()["file"] == {"written": 3, "failed": 0} and running.stats()["buffer"]["dropped"] == 0


def test_a_new_file_is_private_and_a_full_buffer_drops_the_oldest(active: ActiveBundle, tmp_path: Path) -> None:
    async def scenario() -> DecisionLogger:
        running = logger(tmp_path, buffer_events=2, max_batch_events=2, flush_seconds=60)
        assert running._file is not None
        running._file.check()
        for n in range(5):  # all before the loop can flush: only the newest two fit
            running.finished(exchange(active, f"req_{n}"), "ok")
        await running.close()
        return running

    running = asyncio.run(scenario())
    assert [event["decision_id"] for event in lines(tmp_path / "decisions.jsonl")] == ["req_3", "req_4"]
    assert (tmp_path / "decisions.jsonl").stat().st_mode & 0o777 == 0o600
    assert running.stats()["buffer"] == {"dropped": 3, "unencodable": 0, "queued": 0}
    registry = Registry()
    running.watch(registry)
    series = {described.name: values for described, values in registry.snapshot()}
    assert series["portcullis.decision_logs.events"][("buffer", "dropped")] == 3
    assert series["portcullis.decision_logs.events"][("file", "written")] == 2
    assert series["portcullis.decision_logs.queued"] == {("buffer",): 0}


# --- the HTTP sink ----------------------------------------------------------------------------


class WireReceiver(Receiver):
    """The events webhooks' receiver, keeping each body as it came over the wire
    (aiohttp would otherwise decompress a gzip body before the handler reads it)."""

    async def __aenter__(self) -> WireReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, auto_decompress=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/logs?token={QUERY_TOKEN}"
        return self


def decoded(body: bytes) -> list[dict[str, Any]]:
    return json.loads(gzip.decompress(body))


async def no_wait(seconds: float) -> None:
    return None


def test_events_are_posted_as_a_gzip_json_array_with_the_bearer_token(active: ActiveBundle) -> None:
    async def scenario() -> tuple[WireReceiver, DecisionLogger]:
        async with WireReceiver() as receiver:
            sink = HttpSink(receiver.url, "tok-123", max_batch_events=10)
            running = logger(http=sink, flush_seconds=0.01, max_batch_events=10)
            for n in range(3):
                running.finished(exchange(active, f"req_{n}"), "ok")
            await running.close()
            return receiver, running

    receiver, running = asyncio.run(scenario())
    [received] = receiver.received
    assert received.headers["content-encoding"] == "gzip" and received.headers["content-type"] == "application/json"
    assert received.headers["authorization"] == "Bearer tok-123"
    events = decoded(received.body)
    assert isinstance(events, list) and [event["decision_id"] for event in events] == ["req_0", "req_1", "req_2"]
    assert all(event["path"] == "portcullis/decision" and event["bundles"]["portcullis"]["revision"] == "rev-7" for event in events)
    assert running.stats()["http"] == {"sent": 3, "retried": 0, "failed": 0, "dropped": 0, "queued": 0}


def test_a_500_is_retried_and_then_delivered(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[WireReceiver, HttpSink]:
        async with WireReceiver(script=[(500, {}), (503, {"retry-after": "0"})]) as receiver:
            sink = HttpSink(receiver.url, sleep=no_wait)
            sink.offer([b'{"decision_id":"a"}', b'{"decision_id":"b"}'])
            await sink.close()
            return receiver, sink

    receiver, sink = asyncio.run(scenario())
    assert len(receiver.received) == 3 and all(decoded(r.body) == [{"decision_id": "a"}, {"decision_id": "b"}] for r in receiver.received)
    assert sink.stats() == {"sent": 2, "retried": 2, "failed": 0, "dropped": 0, "queued": 0}
    assert QUERY_TOKEN not in caplog.text


def test_a_refusal_is_not_retried_and_giving_up_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "portcullis.decision_logs")

    async def scenario() -> tuple[WireReceiver, HttpSink, HttpSink]:
        async with WireReceiver(script=[(400, {}), (500, {}), (500, {})]) as receiver:
            refused = HttpSink(receiver.url, sleep=no_wait)
            refused.offer([b"{}"])
            await refused.close()
            exhausted = HttpSink(receiver.url, max_attempts=2, sleep=no_wait)
            exhausted.offer([b"{}", b"{}"])
            await exhausted.close()
            return receiver, refused, exhausted

    receiver, refused, exhausted = asyncio.run(scenario())
    assert len(receiver.received) == 3
    assert refused.stats()["failed"] == 1 and refused.stats()["retried"] == 0
    assert exhausted.stats() == {"sent": 0, "retried": 1, "failed": 2, "dropped": 0, "queued": 0}
    assert "gave up on 2 events after 2 attempts" in caplog.text and QUERY_TOKEN not in caplog.text


def test_a_dead_service_is_retried_on_network_errors_without_logging_the_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "portcullis.decision_logs")

    async def scenario() -> HttpSink:
        async with WireReceiver() as receiver:
            url = receiver.url
        sink = HttpSink(url, max_attempts=3, sleep=no_wait)  # the receiver is gone: connection refused
        sink.offer([b"{}"])
        await sink.close()
        return sink

    sink = asyncio.run(scenario())
    assert sink.stats() == {"sent": 0, "retried": 2, "failed": 1, "dropped": 0, "queued": 0}
    assert "ClientConnectorError" in caplog.text and QUERY_TOKEN not in caplog.text and "127.0.0.1" not in caplog.text


def test_a_bounded_buffer_drops_the_oldest_and_counts_them() -> None:
    async def scenario() -> tuple[WireReceiver, HttpSink]:
        async with WireReceiver() as receiver:
            sink = HttpSink(receiver.url, buffer_events=3, max_batch_events=10, sleep=no_wait)
            sink.offer([b'{"n":1}', b'{"n":2}'])
            sink.offer([b'{"n":3}'])  # full now
            sink.offer([b'{"n":4}', b'{"n":5}'])  # before the consumer ran: the oldest two, 1 and 2, go
            assert sink.stats()["dropped"] == 2 and sink.queued == 3
            await sink.close()
            return receiver, sink

    receiver, sink = asyncio.run(scenario())
    assert [event["n"] for r in receiver.received for event in decoded(r.body)] == [3, 4, 5]
    assert sink.stats() == {"sent": 3, "retried": 0, "failed": 0, "dropped": 2, "queued": 0}


# --- the audit records carry the id -------------------------------------------------------------


def test_audit_records_name_the_decision_by_its_id(active: ActiveBundle) -> None:
    made = exchange(active, "req_audit")
    assert started_record(made)["decision_id"] == "req_audit" == started_record(made)["request_id"]
    assert refusal_record(made, "admit", GatewayError(ErrorKind.PERMISSION, "no"))["decision_id"] == "req_audit"
    undecided = exchange(active, "req_early", decided=False)
    assert "decision_id" not in refusal_record(undecided, "authenticate", GatewayError(ErrorKind.AUTHENTICATION, "no"))


def test_no_sink_means_no_logger() -> None:
    assert DecisionLogger.build(DecisionLogsConfig()) is None
    with pytest.raises(DecisionLogsConfigError):
        DecisionLogger.build(DecisionLogsConfig(http=HttpSinkConfig("https://x.example/logs", bearer_token_env="DL_UNSET_TOKEN")), environ={})
