"""The metrics machinery on its own: instruments and their series cap, the Prometheus
text format, merging workers' snapshots, which values may be labels, and the snapshot
as OpenTelemetry's data model, encoded as OTLP sends it."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from portcullis.adapters.telemetry import prometheus
from portcullis.adapters.telemetry.labels import MAX_NAMES, REJECTED, LabelBounds
from portcullis.adapters.telemetry.otlp import metrics_data
from portcullis.adapters.telemetry.registry import OVERFLOW, Registry, merge
from tests.metrics_helpers import samples, value


def test_counters_and_histograms_keep_their_series() -> None:
    registry = Registry()
    requests = registry.counter("portcullis.requests", "{request}", "Requests", ("team", "outcome"))
    duration = registry.histogram("gen_ai.client.operation.duration", "s", "Duration", ("team",), (0.1, 1.0))
    requests.add(("eng", "ok"))
    requests.add(("eng", "ok"), 2)
    requests.add(("ops", "refused"))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        duration.record(("eng",), seconds)
    snapshot = dict((described.name, series) for described, series in registry.snapshot())
    assert snapshot["portcullis.requests"] == {("eng", "ok"): 3, ("ops", "refused"): 1}
    # 0.05 and 0.1 in the first bucket (le is inclusive), 0.5 in the second, 3.0 past the last; then sum, min, max
    assert snapshot["gen_ai.client.operation.duration"] == {("eng",): [2, 1, 1, 3.65, 0.05, 3.0]}


def test_a_full_instrument_counts_into_one_overflow_series() -> None:
    registry = Registry()
    counter = registry.counter("portcullis.requests", "{request}", "Requests", ("model",))
    counter.max_series = 3
    for n in range(10):
        counter.add((f"model-{n}",))
    snapshot = dict((described.name, series) for described, series in registry.snapshot())
    assert len(snapshot["portcullis.requests"]) == 4
    assert snapshot["portcullis.requests"][(OVERFLOW,)] == 7
    assert snapshot["portcullis.metrics.overflow"] == {("portcullis.requests",): 7}


def test_prometheus_text_names_units_and_escapes_as_exporters_do() -> None:
    registry = Registry()
    registry.counter("portcullis.requests", "{request}", 'Requests "by" outcome', ("reason",)).add(('say "hi"\\\n',))
    registry.histogram("gen_ai.client.operation.duration", "s", "Duration", ("gen_ai.provider.name",), (0.5,)).record(("openai",), 0.25)
    registry.gauge("portcullis.bundle.active", "{bundle}", "Bundle", ("revision",), lambda: [(("r1",), 1)])
    text = prometheus.render(registry.snapshot())
    assert "# TYPE portcullis_requests_total counter" in text
    assert 'portcullis_requests_total{reason="say \\"hi\\"\\\\\\n"} 1' in text
    assert '# HELP portcullis_requests_total Requests \\"by\\" outcome' in text
    assert 'gen_ai_client_operation_duration_seconds_bucket{gen_ai_provider_name="openai",le="0.5"} 1' in text
    assert 'gen_ai_client_operation_duration_seconds_bucket{gen_ai_provider_name="openai",le="+Inf"} 1' in text
    assert 'gen_ai_client_operation_duration_seconds_sum{gen_ai_provider_name="openai"} 0.25' in text
    assert 'gen_ai_client_operation_duration_seconds_count{gen_ai_provider_name="openai"} 1' in text
    assert 'portcullis_bundle_active{revision="r1"} 1' in text
    assert len(samples(text)) == 6


def test_workers_snapshots_merge_by_kind() -> None:
    def worker(ok: int, seconds: float, revision_seen: float) -> Any:
        registry = Registry()
        registry.counter("portcullis.requests", "{request}", "Requests", ("outcome",)).add(("ok",), ok)
        registry.histogram("gen_ai.client.operation.duration", "s", "Duration", (), (1.0,)).record((), seconds)
        registry.gauge("portcullis.breaker.state", "{breaker}", "Breakers", ("target",), lambda: [(("a/b@r",), revision_seen)])
        return registry.snapshot()

    merged = prometheus.render(merge([worker(2, 0.5, 0), worker(3, 4.0, 1)]))
    assert value(merged, "portcullis_requests_total", outcome="ok") == 5
    assert value(merged, "gen_ai_client_operation_duration_seconds_count") == 2
    assert value(merged, "gen_ai_client_operation_duration_seconds_sum") == 4.5
    assert value(merged, "gen_ai_client_operation_duration_seconds_bucket", le="1") == 1
    assert value(merged, "portcullis_breaker_state", target="a/b@r") == 1  # a gauge keeps the highest any worker saw


def _bundle() -> Any:
    """What ``LabelBounds`` reads of an active bundle: its digest, catalog and tenants."""
    catalog = {"models": {"gpt-4o-mini": {"targets": [{"provider": "openai-main", "region": "us-east-1"}]}}}
    return SimpleNamespace(digest="d1", catalog=catalog, bundle=SimpleNamespace(data={"portcullis": {"tenants": {"teams": {"eng": {}}}}}))


def test_only_configured_and_bundle_values_become_labels() -> None:
    bounds = LabelBounds(["openai-main"]).for_bundle(_bundle())
    assert (bounds.team("eng"), bounds.team("intruder"), bounds.team(None)) == ("eng", REJECTED, "")
    assert (bounds.model("gpt-4o-mini"), bounds.model("gpt-4o-mini-but-longer")) == ("gpt-4o-mini", REJECTED)
    assert (bounds.provider("openai-main"), bounds.provider("elsewhere")) == ("openai-main", REJECTED)
    assert (bounds.region("us-east-1"), bounds.region("mars-1")) == ("us-east-1", REJECTED)
    assert bounds.named("reason", "unknown_model") == "unknown_model"
    assert bounds.named("reason", "has spaces or <tags>") == REJECTED
    for n in range(MAX_NAMES + 10):
        bounds.named("entity", f"ENTITY_{n}")
    assert bounds.named("entity", "ENTITY_0") == "ENTITY_0"  # seen before the cap: kept
    assert bounds.named("entity", "ENTITY_NEW") == REJECTED  # past the cap: never a new label


def test_a_snapshot_becomes_otlp_data_with_its_values() -> None:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.resources import Resource

    registry = Registry()
    registry.counter("portcullis.requests", "{request}", "Requests", ("outcome",)).add(("ok",), 4)
    registry.histogram("gen_ai.client.token.usage", "{token}", "Tokens", ("gen_ai.token.type",), (16.0, 256.0)).record(("input",), 100)
    request = encode_metrics(metrics_data(registry.snapshot(), Resource.create({"service.name": "portcullis"}), 1, 2))
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    counter = metrics["portcullis.requests"].sum
    assert counter.is_monotonic and counter.data_points[0].as_int == 4
    assert counter.data_points[0].attributes[0].key == "outcome" and counter.data_points[0].attributes[0].value.string_value == "ok"
    histogram = metrics["gen_ai.client.token.usage"].histogram.data_points[0]
    assert list(histogram.bucket_counts) == [0, 1, 0] and list(histogram.explicit_bounds) == [16.0, 256.0]
    assert histogram.count == 1 and math.isclose(histogram.sum, 100) and histogram.min == 100 and histogram.max == 100
