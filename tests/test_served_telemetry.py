"""Metrics and traces of a real gateway process: the metrics listener and its token, what
the counters say after real SDK requests, label values that never come from a client
(10,000 bogus model names, keys and users later, the same series and flat memory), the
supervisor serving every worker's metrics, and spans exported to a file that carry no
prompt, personal data, key or tool argument."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from portcullis.engine.activation import DECISION_CACHE_SIZE
from tests.conftest import UPSTREAM_KEY, Fakes, free_port, wait_for
from tests.fakes import Fail, Reply
from tests.governance_helpers import ACTUAL, BODY, budget_cap, headers, metered_bundle, unique_team
from tests.metrics_helpers import only, samples, value
from tests.pii_helpers import EMAIL, MINI_UPSTREAM, SONNET_UPSTREAM, chat, claude, pii_bundle

TOKEN = "metrics-token-0123456789"


def scrape(port: int, token: str | None = TOKEN) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {token}"} if token else {}, timeout=5)


def metered(fresh_gateway: Any, tmp_path: Path, **overrides: Any) -> tuple[Any, int]:
    """A gateway on the PII bundle whose metrics listener asks for ``TOKEN``; and its port."""
    port = free_port()
    settings = {"metrics": {"listen": {"host": "127.0.0.1", "port": port}, "bearer_token_env": "METRICS_TOKEN"}}
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "bundle"), env={"METRICS_TOKEN": TOKEN}, telemetry=settings, **overrides)
    return gateway, port


def test_no_metrics_and_no_spans_unless_configured(gateway: Any) -> None:
    answer = httpx.get(f"{gateway.url}/metrics", timeout=5)
    assert answer.status_code == 404
    assert "metrics on http" not in gateway.logs()


def test_the_listener_asks_for_its_token_and_counts_what_happened(fresh_gateway: Any, fakes: Fakes, tmp_path: Path) -> None:
    gateway, port = metered(fresh_gateway, tmp_path)
    key = gateway.key("eng")
    fakes.openai_main.script(MINI_UPSTREAM, Reply())
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply())
    chat(gateway, key).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"Write to {EMAIL}"}], max_tokens=32)
    with claude(gateway, key).messages.stream(model="claude-sonnet-4-5", max_tokens=32, messages=[{"role": "user", "content": "Hello"}]) as stream:
        stream.until_done()
    bogus = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "no-such-model-7f3a", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {key}"},
    )
    assert bogus.status_code == 404
    assert (
        httpx.post(
            f"{gateway.url}/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []}, headers={"authorization": "Bearer pk-not-a-key"}
        ).status_code
        == 401
    )

    assert scrape(port, None).status_code == 401
    assert scrape(port, "wrong-token-wrong-token").status_code == 401
    assert httpx.post(f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 405
    assert httpx.get(f"http://127.0.0.1:{port}/other", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 404
    answer = scrape(port)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = answer.text
    assert (
        value(text, "portcullis_requests_total", outcome="ok", portcullis_team="eng", gen_ai_request_model="gpt-4o-mini", portcullis_provider="openai-main")
        == 1
    )
    assert value(text, "portcullis_requests_total", outcome="ok", gen_ai_request_model="claude-sonnet-4-5", protocol="anthropic_messages") == 1
    assert value(text, "portcullis_refusals_total", layer="policy", reason="unknown_model", portcullis_team="eng") == 1
    assert value(text, "portcullis_refusals_total", layer="auth", reason="invalid_api_key", portcullis_team="") == 1
    assert value(text, "portcullis_pii_findings_total", entity="EMAIL", portcullis_team="eng") == 1
    assert value(text, "portcullis_pii_actions_total", action="pseudonymize") == 1
    assert value(text, "gen_ai_client_token_usage_count", gen_ai_token_type="output", gen_ai_provider_name="openai") == 1
    assert value(text, "gen_ai_client_operation_duration_seconds_count", gen_ai_request_model="gpt-4o-mini") == 1
    for measured_at in ("upstream", "client"):  # the stream's first chunk, from the provider and as the client got it
        assert value(text, "gen_ai_client_operation_time_to_first_chunk_seconds_count", portcullis_measured_at=measured_at) == 1
    assert value(text, "portcullis_cost_micro_usd_total", portcullis_team="eng") > 0
    assert value(text, "portcullis_bundle_active") == 1
    for secret in ("no-such-model-7f3a", key, "pk-not-a-key", EMAIL, "Hello"):
        assert secret not in text


def test_metrics_on_the_serving_port_only_behind_the_token(fresh_gateway: Any, tmp_path: Path) -> None:
    gateway = fresh_gateway(env={"METRICS_TOKEN": TOKEN}, telemetry={"metrics": {"bearer_token_env": "METRICS_TOKEN"}})
    assert httpx.get(f"{gateway.url}/metrics").status_code == 401
    answer = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and "portcullis_bundle_active" in answer.text


def test_budget_utilisation_and_a_cooling_key_are_read_from_the_store(fresh_gateway: Any, fakes: Fakes, tmp_path: Path) -> None:
    team = unique_team()
    port = free_port()
    gateway = fresh_gateway(
        bundle=metered_bundle(tmp_path / "b", team, budget_cap(team, "0.10", "CalendarMonth")),
        env={"METRICS_TOKEN": TOKEN},
        telemetry={"metrics": {"listen": {"host": "127.0.0.1", "port": port}, "bearer_token_env": "METRICS_TOKEN"}},
    )
    assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=headers(gateway.key(team))).status_code == 200  # $0.001 of $0.10
    fakes.openai_main.script("gpt-4o-mini-2024-07-18", Fail(429, retry_after=30))
    limited = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {gateway.key('eng')}"},
    )
    assert limited.status_code == 429
    # The cool-down shows at once; the utilisation with the next refresh (every 15 s).
    assert value(scrape(port).text, "portcullis_provider_key_cooling_down", portcullis_provider="openai-main") == 1
    assert only(scrape(port).text, "portcullis_provider_key_cooling_down", portcullis_provider="anthropic-us") == 0

    def utilisation() -> float:
        return value(scrape(port).text, "portcullis_budget_utilisation_ratio", portcullis_team=team, metric="cost", period="month")

    assert wait_for(lambda: utilisation() == ACTUAL / 100_000, timeout=20)
    text = scrape(port).text
    assert f'rule="{team}-cap"' in text and gateway.key(team) not in text


def test_a_missing_token_stops_the_start(tmp_path: Path, fakes: Fakes) -> None:
    from tests.conftest import new_gateway

    gateway = new_gateway(tmp_path / "gw", fakes, telemetry={"metrics": {"listen": {"port": free_port()}, "bearer_token_env": "UNSET_METRICS_TOKEN"}})
    with pytest.raises(RuntimeError) as failed:
        gateway.start()
    assert "UNSET_METRICS_TOKEN must hold a token of 16 or more characters" in str(failed.value)
    assert "Traceback" not in str(failed.value)


async def _bogus_load(url: str, key: str, start: int, count: int, bogus_keys: bool = True) -> dict[int, int]:
    """``count`` requests, each with a model name and a user never seen before; with
    ``bogus_keys``, every fourth with a key never seen before either."""
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        queue = iter(range(start, start + count))

        async def worker() -> None:
            for n in queue:
                bearer = f"pk-bogus-{n:06d}-{'x' * 20}" if bogus_keys and n % 4 == 0 else key
                body = {"model": f"bogus-model-{n:06d}", "user": f"user-{n:06d}@example.com", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {bearer}"})
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

        await asyncio.gather(*(worker() for _ in range(16)))
    return statuses


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_ten_thousand_bogus_names_keys_and_users_add_no_series_and_no_memory(fresh_gateway: Any, tmp_path: Path) -> None:
    gateway, port = metered(fresh_gateway, tmp_path, auth={"max_failures": 1_000_000})
    key = gateway.key("eng")
    assert gateway.process is not None
    # First fill what legitimately grows with distinct requests until its bound: the
    # policy's decision cache (DECISION_CACHE_SIZE entries, refusals included).
    assert asyncio.run(_bogus_load(gateway.url, key, 0, DECISION_CACHE_SIZE + 200, bogus_keys=False)) == {404: DECISION_CACHE_SIZE + 200}
    assert asyncio.run(_bogus_load(gateway.url, key, 50_000, 8)) == {401: 2, 404: 6}  # and one of each refusal's series
    warm = scrape(port).text
    warm_series, warm_rss = len(samples(warm)), _rss_mb(gateway.process.pid)
    statuses = asyncio.run(_bogus_load(gateway.url, key, 100_000, 10_000))
    assert statuses == {401: 2_500, 404: 7_500}  # nothing else: every request reached the stage that judges it
    text = scrape(port).text
    assert len(samples(text)) == len(samples(warm)) == warm_series, "the bogus values added series"
    assert value(text, "portcullis_requests_total", reason="unknown_model") == DECISION_CACHE_SIZE + 200 + 6 + 7_500
    assert value(text, "portcullis_requests_total", reason="invalid_api_key") == 2 + 2_500
    grown = _rss_mb(gateway.process.pid) - warm_rss
    assert grown < 3, f"the gateway grew {grown:.1f} MB over 10,000 bogus model names, users and keys"
    assert "bogus-model" not in text and "pk-bogus" not in text and "user-" not in text


def test_the_supervisor_serves_every_workers_metrics_and_each_worker_writes_its_own_spans(fresh_gateway: Any, fakes: Fakes, tmp_path: Path) -> None:
    port, spans_path = free_port(), tmp_path / "spans.jsonl"
    telemetry = {"metrics": {"listen": {"host": "127.0.0.1", "port": port}}, "traces": {"exporter": "console", "path": str(spans_path)}}
    gateway = fresh_gateway(workers=2, telemetry=telemetry)
    key = gateway.key("eng")
    fakes.openai_main.script(MINI_UPSTREAM, Reply())
    for _ in range(20):  # new connections, so the kernel spreads them over both workers
        with httpx.Client() as client:
            assert (
                client.post(
                    f"{gateway.url}/v1/chat/completions",
                    json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": f"Bearer {key}"},
                ).status_code
                == 200
            )
    assert wait_for(lambda: value(scrape(port, None).text, "portcullis_requests_total", outcome="ok") == 20, timeout=10), scrape(port, None).text[:2000]
    gateway.stop()  # each worker exports what it still batches
    files = [spans_path, tmp_path / "spans.w1.jsonl"]
    assert all(path.exists() for path in files), "worker 1 writes beside worker 0's file, not into it"
    spans = [json.loads(line) for path in files for line in path.read_text().splitlines()]  # every line whole
    assert sum(span["kind"] == "SpanKind.SERVER" for span in spans) == 20


def test_spans_continue_the_clients_trace_and_carry_no_content(fresh_gateway: Any, fakes: Fakes, tmp_path: Path) -> None:
    spans_path = tmp_path / "spans.jsonl"
    gateway = fresh_gateway(
        bundle=pii_bundle(tmp_path / "bundle"), telemetry={"traces": {"exporter": "console", "path": str(spans_path), "propagate_to_providers": True}}
    )
    key = gateway.key("eng")
    fakes.openai_main.script(MINI_UPSTREAM, Reply())
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    prompt = f"Summarise the incident report for {EMAIL} in two lines"
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"ticket": {"type": "string"}}}}}]
    client = chat(gateway, key, traceparent=f"00-{trace_id}-{parent}-01")
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], tools=tools, max_tokens=32)
    assert (
        httpx.post(
            f"{gateway.url}/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []}, headers={"authorization": "Bearer pk-not-a-key"}
        ).status_code
        == 401
    )
    gateway.stop()  # the batch is exported at shutdown
    spans = [json.loads(line) for line in spans_path.read_text().splitlines()]
    names = {span["name"] for span in spans if span["context"]["trace_id"] == f"0x{trace_id}"}
    assert {
        "POST /v1/chat/completions",
        "authenticate",
        "parse",
        "decide",
        "admit pii",
        "admit budget",
        "dispatch",
        "guard",
        "settle",
        "attempt openai-main",
    } <= names
    server = next(span for span in spans if span["context"]["trace_id"] == f"0x{trace_id}" and span["kind"] == "SpanKind.SERVER")
    assert server["parent_id"] == f"0x{parent}"
    assert server["attributes"]["portcullis.team"] == "eng" and server["attributes"]["gen_ai.request.model"] == "gpt-4o-mini"
    upstream = [r for r in fakes.openai_main.received if r.path.endswith("/chat/completions")]
    assert upstream and upstream[-1].headers.get("traceparent", "").startswith(f"00-{trace_id}-")
    exported = spans_path.read_text()
    for secret in (EMAIL, "incident report", key, "pk-not-a-key", "ticket", UPSTREAM_KEY):
        assert secret not in exported, secret


class Collector:
    """An OpenTelemetry collector of the test's own: what arrives over OTLP/HTTP, decoded."""

    def __init__(self) -> None:
        import http.server
        import threading

        received: list[tuple[str, bytes]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.received = received
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for path, body in list(self.received):
            if path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                found += [span for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
        return found

    def metric_values(self, name: str) -> list[float]:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        found = []
        for path, body in list(self.received):
            if path == "/v1/metrics":
                request = ExportMetricsServiceRequest.FromString(body)
                for metric in (m for resource in request.resource_metrics for scope in resource.scope_metrics for m in scope.metrics):
                    if metric.name == name:
                        found += [point.as_int or point.as_double for point in metric.sum.data_points]
        return found

    def stop(self) -> None:
        self._server.shutdown()


def test_metrics_and_spans_reach_an_otlp_collector(fresh_gateway: Any, fakes: Fakes) -> None:
    collector = Collector()
    try:
        telemetry = {
            "metrics": {"otlp": {"endpoint": f"{collector.url}/v1/metrics", "interval_seconds": 0.3}},
            "traces": {"exporter": "otlp", "endpoint": f"{collector.url}/v1/traces"},
        }
        gateway = fresh_gateway(telemetry=telemetry)
        key = gateway.key("eng")
        fakes.openai_main.script(MINI_UPSTREAM, Reply())
        chat(gateway, key).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello there"}], max_tokens=16)
        assert wait_for(lambda: 1 in collector.metric_values("portcullis.requests"), timeout=10)
        gateway.stop()  # spans are batched: stopping exports what is left
        spans = collector.spans()
        assert {"POST /v1/chat/completions", "dispatch", "attempt openai-main"} <= {span.name for span in spans}
        assert b"Hello there" not in b"".join(body for _, body in collector.received)
    finally:
        collector.stop()
