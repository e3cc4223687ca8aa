"""The telemetry of one gateway process: its metrics and tracer, and where its metrics go
— its own listener (one process), the supervisor's (a worker of several, pushed over the
state channel: ``board.py``), ``/metrics`` on the serving port behind the bearer token,
and/or an OpenTelemetry collector (``otlp.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from portcullis.adapters.telemetry import prometheus
from portcullis.adapters.telemetry.board import METHODS, PUSH_SECONDS
from portcullis.adapters.telemetry.config import TelemetryConfig, TelemetryConfigError
from portcullis.adapters.telemetry.gateway_metrics import GatewayMetrics
from portcullis.adapters.telemetry.listener import MetricsListener, authorised
from portcullis.adapters.telemetry.registry import Registry
from portcullis.adapters.telemetry.store_gauges import StoreGauges
from portcullis.adapters.telemetry.tracing import Tracer

if TYPE_CHECKING:
    from portcullis.adapters.pipeline import Clock, RequestObserver
    from portcullis.adapters.providers.keys import Capacity, KeyPool
    from portcullis.adapters.store.ledger import Ledger
    from portcullis.adapters.worker import WorkerLink

log = logging.getLogger("portcullis.metrics")


class Telemetry:
    def __init__(
        self, settings: TelemetryConfig, provider_types: Mapping[str, str], active_bundle: Callable[[], Any], open_breakers: Callable[[], Mapping[str, str]]
    ) -> None:
        self._settings = settings
        self._active_bundle = active_bundle
        self.registry = Registry()
        metrics = settings.metrics
        self.metrics = GatewayMetrics(self.registry, provider_types, active_bundle, open_breakers) if metrics is not None else None
        self._token = metrics.token() if metrics is not None else None  # a missing token stops start-up here
        self.tracer = Tracer(settings.traces) if settings.traces.exporter != "none" else None
        self._listener: MetricsListener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._finally: list[Callable[[], Any]] = []  # sent once more as the process stops: its last counts
        self.store_gauges: StoreGauges | None = None

    def watch_store(self, ledger: Ledger, capacity: Capacity, pools: Mapping[str, KeyPool], clock: Clock) -> None:
        """Budget utilisation and provider keys' limits and cool-downs, read from the store
        by a background task that ``start`` starts (``store_gauges.py``); with metrics off, nothing."""
        if self.metrics is not None and self.store_gauges is None:
            self.store_gauges = StoreGauges(self.registry, ledger, capacity, pools, self._active_bundle, clock)

    @property
    def observers(self) -> tuple[RequestObserver, ...]:
        return (self.metrics,) if self.metrics is not None else ()

    @property
    def on_serving_port(self) -> bool:
        """``/metrics`` on the clients' port: only with a token, and only without a listener of its own."""
        metrics = self._settings.metrics
        return metrics is not None and not metrics.listens and self._token is not None

    def render(self) -> str:
        return prometheus.render(self.registry.snapshot())

    def authorised(self, header: str | None) -> bool:
        return authorised(header, self._token)

    async def start(self, worker: WorkerLink | None = None) -> None:
        metrics = self._settings.metrics
        if metrics is None:
            return
        if metrics.listens and worker is None:
            assert metrics.host is not None and metrics.port is not None
            self._listener = MetricsListener(self.render, self._token)
            try:
                port = await self._listener.start(metrics.host, metrics.port)
            except OSError as error:
                raise TelemetryConfigError(f"telemetry.metrics.listen: cannot listen on {metrics.host}:{metrics.port}: {error.strerror}") from None
            log.info("metrics on http://%s:%d/metrics%s", metrics.host, port, " (bearer token required)" if self._token else "")
        elif metrics.listens and worker is not None:  # the supervisor serves them, from each worker's pushes
            from portcullis.adapters.store.state_host import HostedProxy

            board = HostedProxy(worker.state, "metrics", METHODS)
            self._send(PUSH_SECONDS, lambda: board.report(worker.index, self.registry.snapshot()))
        if metrics.otlp_endpoint is not None:
            from portcullis.adapters.telemetry.otlp import OtlpPush

            self._send(metrics.otlp_interval_seconds, OtlpPush(metrics.otlp_endpoint, self.registry).export)
        if self.store_gauges is not None:
            self.store_gauges.start()

    def _send(self, seconds: float, action: Callable[[], Any]) -> None:
        self._tasks.append(asyncio.ensure_future(self._every(seconds, action)))
        self._finally.append(action)

    async def _every(self, seconds: float, action: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await action()
            except Exception as error:  # the next round tries again; requests never wait on this
                log.warning("metrics could not be sent: %s", type(error).__name__)

    async def stop_store_gauges(self) -> None:
        """Stop reading the store, before it closes (``close`` does it too)."""
        if self.store_gauges is not None:
            await self.store_gauges.close()

    async def close(self) -> None:
        await self.stop_store_gauges()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for action in self._finally:
            with contextlib.suppress(Exception):
                await action()
        if self._listener is not None:
            await self._listener.close()
        if self.tracer is not None:
            self.tracer.close()
