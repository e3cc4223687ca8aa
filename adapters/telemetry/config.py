"""The ``telemetry`` section of the configuration: where metrics are served or pushed,
and where traces go. Off unless configured: no listener opens and no span is made by
default."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_EXPORTERS = ("none", "console", "otlp")


class TelemetryConfigError(Exception):
    """A telemetry setting cannot be used; the message names it."""


@dataclass(frozen=True)
class MetricsConfig:
    host: str | None = None  # with port: the metrics listener of its own
    port: int | None = None
    bearer_token_env: str | None = None  # the token scrapers must present
    otlp_endpoint: str | None = None  # pushed there too (OTLP/HTTP), every otlp_interval_seconds
    otlp_interval_seconds: float = 30.0

    @property
    def listens(self) -> bool:
        return self.port is not None

    def token(self) -> str | None:
        """The bearer token, read at start-up so a missing one stops it."""
        if self.bearer_token_env is None:
            return None
        value = os.environ.get(self.bearer_token_env, "")
        if len(value) < 16:
            raise TelemetryConfigError(f"telemetry.metrics.bearer_token_env: {self.bearer_token_env} must hold a token of 16 or more characters")
        return value


@dataclass(frozen=True)
class TracesConfig:
    exporter: str = "none"
    path: Path | None = None  # console: the file spans are written to (one JSON document each); unset: standard output
    endpoint: str | None = None  # otlp: the collector's OTLP/HTTP traces URL
    sample_ratio: float = 1.0  # of requests without a sampled parent
    propagate_to_providers: bool = False  # send traceparent upstream


@dataclass(frozen=True)
class TelemetryConfig:
    metrics: MetricsConfig | None = None
    traces: TracesConfig = field(default_factory=TracesConfig)


def telemetry_config(section: dict[str, Any], resolve: Callable[[str], Path], workers: int = 1) -> TelemetryConfig:
    """From the validated ``telemetry`` section (``schemas/config.schema.json``)."""
    metrics = section.get("metrics")
    parsed_metrics = None
    if metrics is not None:
        listen, otlp = metrics.get("listen"), metrics.get("otlp") or {}
        if listen is None and "bearer_token_env" not in metrics and not otlp:
            raise TelemetryConfigError(
                "telemetry.metrics: set listen (a metrics listener of its own), bearer_token_env (/metrics on the serving port, behind that token) or otlp"
            )
        if workers > 1 and listen is None and "bearer_token_env" in metrics:
            raise TelemetryConfigError(
                "telemetry.metrics: with workers > 1, /metrics on the serving port would answer for one worker only;"
                " give the metrics a listener of their own (telemetry.metrics.listen): the supervisor serves it for every worker"
            )
        parsed_metrics = MetricsConfig(
            host=listen.get("host", "127.0.0.1") if listen is not None else None,
            port=listen.get("port", 9464) if listen is not None else None,
            bearer_token_env=metrics.get("bearer_token_env"),
            otlp_endpoint=otlp.get("endpoint"),
            otlp_interval_seconds=otlp.get("interval_seconds", 30.0),
        )
    traces = section.get("traces") or {}
    exporter = traces.get("exporter", "none")
    if exporter == "otlp" and "endpoint" not in traces:
        raise TelemetryConfigError("telemetry.traces: the otlp exporter needs an endpoint (the collector's OTLP/HTTP traces URL)")
    return TelemetryConfig(
        metrics=parsed_metrics,
        traces=TracesConfig(
            exporter=exporter,
            path=resolve(traces["path"]) if "path" in traces else None,
            endpoint=traces.get("endpoint"),
            sample_ratio=traces.get("sample_ratio", 1.0),
            propagate_to_providers=traces.get("propagate_to_providers", False),
        ),
    )
