"""Decision logs: every decision the policy made, as an OPA decision-log event, to a file
and/or an OPA-compatible HTTP service (``sinks``), for audit and for replaying the
inputs against another bundle.

The logger is a ``RequestObserver``: it hears of each request once it has ended and
needs no hook in the executor. The plan already holds what was decided from and what
the policy returned (``DecisionPlan.source_input`` / ``source``, kept by reference
when the policy evaluated it), so the request path does no work for it when decision
logs are off. When they are on, ``finished`` only samples (a hash of the request id)
and queues a reference; building, masking and encoding the events, and writing the
file, happen on a thread of the logger's own, a batch at a time. Requests refused
before the policy decided (authentication, parsing) have no decision and are not logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import importlib.metadata
import json
import logging
import os
import socket
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

from portcullis.adapters.decision_logs.config import DecisionLogsConfig
from portcullis.adapters.decision_logs.sinks import FileSink, HttpSink, Warnings
from portcullis.adapters.json_bytes import compact, parse
from portcullis.engine.decision_log import APP, decision_event, sampled

if TYPE_CHECKING:
    from portcullis.adapters.pipeline import Exchange
    from portcullis.adapters.telemetry.registry import Registry
    from portcullis.engine.errors import GatewayError

log = logging.getLogger("portcullis.decision_logs")


class PendingDecision(NamedTuple):
    """What ``finished`` keeps of a decision: references, nothing built yet (a tuple: the
    cheapest thing to make on the loop)."""

    decision_id: str
    input_json: str
    result: Mapping[str, Any]
    revision: str
    digest: str
    arrived: dt.datetime


def gateway_labels() -> dict[str, str]:
    """OPA's ``labels``: this gateway process (as OpenTelemetry's service.instance.id), its version."""
    try:
        version = importlib.metadata.version("portcullis")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"id": f"{socket.gethostname()}-{os.getpid()}", "version": version, "app": APP}


class DecisionLogger:
    def __init__(self, config: DecisionLogsConfig, file: FileSink | None, http: HttpSink | None, labels: Mapping[str, str] | None = None) -> None:
        self._config = config
        self._file = file
        self._http = http
        self._labels = dict(labels or gateway_labels())
        self._masks_result = any(pointer[0] == "result" for pointer in config.mask)
        self._pending: deque[PendingDecision] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="portcullis-decision-logs")  # one: batches stay in order
        self._closing = False
        self._building = 0
        self._warnings = Warnings()
        self.dropped = 0  # the buffer was full, or the logger closed
        self.unencodable = 0

    @classmethod
    def build(cls, config: DecisionLogsConfig, environ: Mapping[str, str] | None = None) -> DecisionLogger | None:
        """The logger of the configured sinks, or None when decision logs are off. Reads
        the bearer token and creates the file now: either failing stops start-up."""
        if not config.enabled:
            return None
        file = FileSink(config.file.path) if config.file is not None else None
        if file is not None:
            file.check()
        http = None
        if config.http is not None:
            http = HttpSink(
                config.http.url,
                config.http.token(environ),
                timeout_seconds=config.http.timeout_seconds,
                max_attempts=config.http.max_attempts,
                buffer_events=config.buffer_events,
                max_batch_events=config.max_batch_events,
            )
        return cls(config, file, http)

    # --- the request path ---------------------------------------------------------------------

    def finished(self, exchange: Exchange, outcome: str, error: GatewayError | None = None, stage: str | None = None, layer: str | None = None) -> None:
        plan, bundle = exchange.plan, exchange.bundle
        if plan is None or bundle is None or plan.source is None or plan.source_input is None:
            return  # no decision was made
        if self._config.sample_ratio < 1.0 and not sampled(exchange.request_id, self._config.sample_ratio):
            return
        if self._closing:
            self.dropped += 1
            return
        if len(self._pending) >= self._config.buffer_events:
            self._pending.popleft()
            self.dropped += 1
            self._warnings.warn(
                "full", "decision logs: the buffer is full (%d); dropping the oldest decisions (%d so far)", self._config.buffer_events, self.dropped
            )
        self._pending.append(PendingDecision(exchange.request_id, plan.source_input, plan.source, bundle.revision, bundle.digest, exchange.arrived))
        if len(self._pending) == 1 or len(self._pending) >= self._config.max_batch_events:
            self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flushing(), name="decision logs")

    # --- off the request path -----------------------------------------------------------------

    async def _flushing(self) -> None:
        """A batch every ``flush_seconds`` from its first decision, or as soon as one fills."""
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(self._pending) < self._config.max_batch_events and not self._closing:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._config.flush_seconds)
            batch = [self._pending.popleft() for _ in range(min(self._config.max_batch_events, len(self._pending)))]
            self._building = len(batch)
            try:
                lines = await asyncio.get_running_loop().run_in_executor(self._thread, self._written, batch)
                if self._http is not None:
                    self._http.offer(lines)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug here must not end the logging
                log.error("decision logs: a batch of %d failed (%s)", len(batch), type(error).__name__)
            finally:
                self._building = 0

    def _written(self, batch: list[PendingDecision]) -> list[bytes]:
        """The batch's events, encoded, and appended to the file. On the logger's thread."""
        lines = []
        for pending in batch:
            try:
                event = self.event(pending)
                try:
                    lines.append(compact(event))
                except UnicodeEncodeError:  # text UTF-8 cannot hold (a lone surrogate): escaped, as the policy read it
                    lines.append(json.dumps(event, separators=(",", ":")).encode())
            except Exception as error:  # a value JSON cannot hold: counted, never the request's problem
                self.unencodable += 1
                self._warnings.warn("encode", "decision logs: decision %s could not be encoded (%s)", pending.decision_id, type(error).__name__)
        if self._file is not None:
            self._file.write(lines)
        return lines

    def event(self, pending: PendingDecision) -> dict[str, Any]:
        return decision_event(
            decision_id=pending.decision_id,
            input_document=parse(pending.input_json.encode()),
            result=copy.deepcopy(pending.result) if self._masks_result else pending.result,  # the plan's own is shared with the cache
            revision=pending.revision,
            digest=pending.digest,
            labels=self._labels,
            timestamp=pending.arrived,
            mask=self._config.mask,
        )

    # --- what happened ------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._pending) + self._building

    def stats(self) -> dict[str, dict[str, int]]:
        """Per part: the logger's buffer (dropped, unencodable, queued), the file (written,
        failed) and the HTTP sink (sent, retried, failed, dropped, queued)."""
        stats = {"buffer": {"dropped": self.dropped, "unencodable": self.unencodable, "queued": self.queued}}
        if self._file is not None:
            stats["file"] = self._file.stats()
        if self._http is not None:
            stats["http"] = self._http.stats()
        return stats

    def watch(self, registry: Registry) -> None:
        """Its counts as metrics, read when collected."""
        registry.observed_counter(
            "portcullis.decision_logs.events",
            "{event}",
            "Decision-log events by sink and what became of them: written or sent, retried, failed, dropped (buffer full)",
            ("sink", "result"),
            lambda: [((sink, result), value) for sink, counts in self.stats().items() for result, value in counts.items() if result != "queued"],
        )
        registry.gauge(
            "portcullis.decision_logs.queued",
            "{event}",
            "Decision-log events waiting to be written or sent",
            ("sink",),
            lambda: [((sink,), counts["queued"]) for sink, counts in self.stats().items() if "queued" in counts],
        )

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 -- a grace period: after it the rest is given up
        """Write and send what is pending for up to ``timeout`` seconds, then give up on the rest."""
        self._closing = True
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        if self._task is not None and not self._task.done():
            _, pending = await asyncio.wait([self._task], timeout=max(0.0, timeout))
            for task in pending:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._pending:
            log.warning("decision logs: %d decisions left unwritten at close", len(self._pending))
        if self._http is not None:
            await self._http.close(max(0.0, deadline - loop.time()))
        self._thread.shutdown(wait=False)
