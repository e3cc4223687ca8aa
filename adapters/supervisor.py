"""``workers: N`` (N > 1): ``portcullis serve`` becomes a small supervisor of N gateway
processes serving one port.

Every worker listens on the port with its own ``SO_REUSEPORT`` socket, and the kernel
spreads new connections over them by hash. An inherited shared socket was tried first
and measured: idle workers race for each connection and the first awake takes a whole
burst (16 wrk connections: one worker got 859 requests, the other 3), so keep-alive
clients pinned one core. The supervisor binds the port first with the same option but
never listens (so it receives no connections): the port check and the bind error stay
those of one process, ``listen.port: 0`` resolves once, and the port stays reserved while
a worker restarts. Only processes of the same user can join a ``SO_REUSEPORT`` group; the
cost is that connections queued on a worker that dies are reset with it.

It also hosts the in-memory state the workers share on the embedded store
(``store/hosted.py``), each worker reaching it over a socketpair it inherits. Signals:
SIGTERM/SIGINT are forwarded to every worker (each drains for ``listen.drain_seconds``;
a second signal skips the drain), SIGHUP too (each reloads its bundle). Workers run in
their own session, so a terminal's Ctrl-C reaches them once, through the supervisor. A
worker that dies unexpectedly is replaced, with a growing delay when it keeps dying. A
worker that fails at start-up stops the whole start with that worker's message and
status. Worker 0 starts first (it migrates the SQLite file and prints the
``--demo-key`` text), then the others together.

It imports none of the gateway's heavy parts (regorus, presidio, tiktoken): it runs no
policy and serves no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure
from portcullis.adapters.config import Config
from portcullis.adapters.store.state_host import FAILED, READY, StateHost
from portcullis.adapters.telemetry.board import METHODS as METRICS_METHODS
from portcullis.adapters.telemetry.board import MetricsBoard
from portcullis.adapters.telemetry.config import TelemetryConfigError
from portcullis.adapters.telemetry.listener import MetricsListener
from portcullis.adapters.worker import port_socket

log = logging.getLogger("portcullis.supervisor")

BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before replacing a worker that keeps dying
STEADY_SECONDS = 30.0  # a worker that served this long died by accident, not in a loop: no delay


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failure: tuple[str, int] | None = None  # the text and status it reported
    started_at: float = 0.0
    deaths: int = 0  # in a row, each soon after its start


def supervise(config: Config, config_path: Path, demo_key: str | None) -> int:
    return asyncio.run(Supervisor(config, config_path, demo_key).run())


def reserve_port(config: Config) -> socket.socket:
    """The port, bound for the workers' group but not listening."""
    try:
        return port_socket(config.host, config.port)
    except OSError as error:
        raise Failure(f"cannot listen on {config.host}:{config.port}: {error.strerror}") from None


class Supervisor:
    def __init__(self, config: Config, config_path: Path, demo_key: str | None) -> None:
        self._config = config
        self._config_path = config_path
        self._demo_key = demo_key
        self._workers = [_Worker(index) for index in range(config.workers)]
        self._stopping = asyncio.Event()
        self._serving = False  # every worker has started once: deaths are replaced from now on
        self._listener: socket.socket | None = None
        self._host: StateHost | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> int:
        self._listener = reserve_port(self._config)
        if self._config.store.kind == "embedded":
            from portcullis.adapters.store.hosted import build_host

            self._host = build_host(self._config)
        else:  # Redis and PostgreSQL hold everything shared: the channel only tells a worker it was orphaned
            self._host = StateHost({}, {})
        metrics = await self._serve_metrics(self._host)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, self._forward, signum)
        try:
            status = await self._start_all()
            if status:
                return status
            if not self._stopping.is_set():
                self._serving = True
                log.info("%d workers serving on %s:%d (supervisor pid %d)", len(self._workers), self._config.host, self._listener.getsockname()[1], os.getpid())
            await self._all_exited()
            log.info("every worker has stopped")
            return 0
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            self._listener.close()
            if metrics is not None:
                await metrics.close()

    async def _serve_metrics(self, host: StateHost) -> MetricsListener | None:
        """The metrics listener, for every worker: each pushes its measurements here (``telemetry/board.py``)."""
        settings = self._config.telemetry.metrics
        if settings is None or not settings.listens:
            return None
        assert settings.host is not None and settings.port is not None
        board = MetricsBoard()
        host.host("metrics", board, METRICS_METHODS)
        try:
            listener = MetricsListener(board.render, settings.token())
        except TelemetryConfigError as error:
            raise Failure(str(error)) from None
        try:
            port = await listener.start(settings.host, settings.port)
        except OSError as error:
            raise Failure(f"telemetry.metrics.listen: cannot listen on {settings.host}:{settings.port}: {error.strerror}") from None
        log.info("metrics of every worker on http://%s:%d/metrics", settings.host, port)
        return listener

    async def _start_all(self) -> int:
        """0 once every worker serves (or a stop came first); else the failed worker's status."""
        first, *others = self._workers
        await self._spawn(first, self._demo_key)
        if not await self._started(first):
            return await self._start_failed(first)
        for worker in others:
            await self._spawn(worker, None)
        for worker in others:
            if not await self._started(worker):
                return await self._start_failed(worker)
        return 0

    async def _spawn(self, worker: _Worker, demo_key: str | None) -> None:
        assert self._listener is not None and self._host is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", "portcullis.adapters.worker", "--config", str(self._config_path), "--index", str(worker.index)]
        command += ["--port", str(self._listener.getsockname()[1]), "--state-fd", str(theirs.fileno())]
        if demo_key:
            command += ["--demo-key", demo_key]
        worker.ready = asyncio.Event()
        worker.failure = None
        worker.started_at = time.monotonic()
        try:
            worker.process = await asyncio.create_subprocess_exec(*command, pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        self._keep(self._host.serve(ours, lambda message: self._control(worker, message)))
        self._keep(self._watch(worker, worker.process))

    def _control(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        if message[0] == READY:
            worker.ready.set()
            if self._serving:
                log.info("worker %d replaced (pid %d)", worker.index, worker.process.pid if worker.process else 0)
        elif message[0] == FAILED:
            worker.failure = (str(message[1]), int(message[2]))

    async def _started(self, worker: _Worker) -> bool:
        assert worker.process is not None
        ready = asyncio.ensure_future(worker.ready.wait())
        exited = asyncio.ensure_future(worker.process.wait())
        await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        exited.cancel()
        return worker.ready.is_set()

    async def _start_failed(self, worker: _Worker) -> int:
        assert worker.process is not None
        status = await worker.process.wait()
        self._stop_workers(signal.SIGTERM)
        await self._all_exited()
        if self._stopping.is_set() and worker.failure is None:
            return 0  # stopped while starting
        text, code = worker.failure or (f"portcullis: worker {worker.index} exited with status {status} while starting", 1)
        print(text, file=sys.stderr, flush=True)
        return code

    async def _watch(self, worker: _Worker, process: asyncio.subprocess.Process) -> None:
        status = await process.wait()
        if self._stopping.is_set() or (not self._serving and not worker.ready.is_set()):
            return  # stopping, or a start-up failure (``_start_all`` judges it)
        lived = time.monotonic() - worker.started_at
        worker.deaths = 0 if lived >= STEADY_SECONDS else worker.deaths + 1
        delay = BACKOFF_SECONDS[min(worker.deaths, len(BACKOFF_SECONDS)) - 1] if worker.deaths else 0.0
        why = f": {worker.failure[0]}" if worker.failure else ""
        log.warning("worker %d (pid %d) exited unexpectedly with status %s%s; starting another in %.1f s", worker.index, process.pid, status, why, delay)
        if delay:
            with contextlib.suppress(TimeoutError):  # a stop during the delay ends it
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        if not self._stopping.is_set():
            await self._spawn(worker, None)

    def _forward(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            log.info("SIGHUP: every worker reloads its policy bundle")
        elif not self._stopping.is_set():
            log.info("%s: stopping %d workers (each drains for up to %.0f s)", name, len(self._workers), self._config.drain_seconds)
            self._stopping.set()
        else:
            log.warning("%s again: workers cancel their requests in flight now", name)
        self._stop_workers(signum)

    def _stop_workers(self, signum: int) -> None:
        if signum != signal.SIGHUP:
            self._stopping.set()
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signum)

    async def _all_exited(self) -> None:
        while True:
            await self._stopping.wait()
            live = [worker.process for worker in self._workers if worker.process is not None and worker.process.returncode is None]
            if not live:
                return
            await asyncio.wait([asyncio.ensure_future(process.wait()) for process in live])

    def _keep(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
