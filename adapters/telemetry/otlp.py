"""The metrics pushed to an OpenTelemetry collector: a snapshot of the registry as the
SDK's ``MetricsData`` (cumulative since this process started), sent by the SDK's
OTLP/HTTP exporter on a worker thread (it blocks on its HTTP call). Needs the ``otlp``
extra; each process pushes its own, told apart by ``service.instance.id``."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

from portcullis.adapters.telemetry.registry import Registry, Snapshot


class OtlpPush:
    def __init__(self, endpoint: str, registry: Registry) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError:
            raise RuntimeError("telemetry.metrics.otlp needs the otlp extra: pip install 'portcullis[otlp]'") from None
        from opentelemetry.sdk.resources import Resource

        self._exporter = OTLPMetricExporter(endpoint=endpoint)
        self._registry = registry
        self._started = time.time_ns()
        self._resource = Resource.create({"service.name": "portcullis", "service.instance.id": f"{socket.gethostname()}-{os.getpid()}"})

    async def export(self) -> None:
        data = metrics_data(self._registry.snapshot(), self._resource, self._started, time.time_ns())
        result = await asyncio.to_thread(self._exporter.export, data)
        if getattr(result, "name", "SUCCESS") != "SUCCESS":
            raise ConnectionError("the collector refused the metrics")


def metrics_data(snapshot: Snapshot, resource: Any, started: int, now: int) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    cumulative = AggregationTemporality.CUMULATIVE
    metrics = []
    for described, series in snapshot:
        if not series:
            continue
        points: list[Any] = []
        for values, value in series.items():
            attributes = dict(zip(described.labels, values, strict=True))
            if described.kind == "histogram":
                counts = [int(count) for count in value[:-3]]
                points.append(HistogramDataPoint(attributes, started, now, sum(counts), value[-3], counts, list(described.buckets), value[-2], value[-1]))
            else:
                points.append(NumberDataPoint(attributes, started, now, value))
        if described.kind == "histogram":
            data: Any = Histogram(points, cumulative)
        elif described.kind == "counter":
            data = Sum(points, cumulative, is_monotonic=True)
        else:
            data = Gauge(points)
        metrics.append(Metric(described.name, described.description, described.unit, data))
    scope = ScopeMetrics(InstrumentationScope("portcullis"), metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])
