"""Where decision-log events go: a file of JSON lines, and an HTTP service that takes
them as OPA's decision-log plugin sends them (a POST of a gzip-compressed JSON array).

Both receive events already encoded (one JSON document each, no newline) and never
raise into the gateway: a failure is counted and logged, at most once a minute, by its
class only (an error's message can hold the URL, and the URL's query a token).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from portcullis.adapters.events.delivery import AttemptOutcome, backoff_delay, retry_after_seconds

log = logging.getLogger("portcullis.decision_logs")

USER_AGENT = "Portcullis-DecisionLogs/1"
WARN_EVERY_SECONDS = 60.0


class Warnings:
    """At most one warning a minute per kind: a dead receiver fails thousands of times."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._last: dict[str, float] = {}

    def warn(self, kind: str, message: str, *args: Any) -> None:
        now = self._now()
        last = self._last.get(kind)
        if last is None or now - last >= WARN_EVERY_SECONDS or now < last:
            self._last[kind] = now
            log.warning(message, *args)


class FileSink:
    """Appends each batch with one write to a file opened for it (O_APPEND): several
    workers share one file and each line stays whole, and a file moved away by log
    rotation is let go at the next batch. ``write`` blocks: call it off the event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = 0
        self.failed = 0
        self._warnings = Warnings()

    def check(self) -> None:
        """Create the file (0600, its directory too) now, so start-up fails when it cannot be written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def write(self, lines: Sequence[bytes]) -> None:
        if not lines:
            return
        data = b"".join(line + b"\n" for line in lines)
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
            finally:
                os.close(descriptor)
        except OSError as error:
            self.failed += len(lines)
            self._warnings.warn("write", "decision logs: writing %d events to the file failed (%s)", len(lines), type(error).__name__)
            return
        self.written += len(lines)

    def stats(self) -> dict[str, int]:
        return {"written": self.written, "failed": self.failed}


def gzip_array(lines: Sequence[bytes]) -> bytes:
    """The events as one gzip-compressed JSON array, the body OPA's service API takes."""
    return gzip.compress(b"[" + b",".join(lines) + b"]", compresslevel=6, mtime=0)


class HttpSink:
    """Batches events for an OPA-compatible decision-log service and sends them, in order,
    retrying what may pass (network errors, timeouts, 408, 425, 429, 5xx) with the events
    webhooks' backoff (full jitter, Retry-After honoured). Redirects are not followed.
    Events wait in a bounded queue: when it is full the oldest go, counted as dropped."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_seconds: float = 5.0,
        max_attempts: int = 5,
        buffer_events: int = 10_000,
        max_batch_events: int = 500,
        first_backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 30.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        if max_attempts < 1 or buffer_events < 1 or max_batch_events < 1:
            raise ValueError("decision logs: max_attempts, buffer_events and max_batch_events must be at least 1")
        self._url = url
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._max_attempts = max_attempts
        self._buffer = buffer_events
        self._batch = max_batch_events
        self._first_backoff, self._max_backoff = first_backoff_seconds, max_backoff_seconds
        self._sleep, self._now = sleep, now
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False
        self._in_flight = 0
        self._warnings = Warnings()
        self.sent = self.retried = self.failed = self.dropped = 0

    def __repr__(self) -> str:  # never the URL
        return f"HttpSink(queued={self.queued})"

    @property
    def queued(self) -> int:
        return len(self._queue) + self._in_flight

    def offer(self, lines: Sequence[bytes]) -> None:
        """Queue events; returns at once. Called on the event loop's thread."""
        if not lines:
            return
        if self._closing:
            self.dropped += len(lines)
            self._warnings.warn("closed", "decision logs: the HTTP sink is closed; %d events dropped so far", self.dropped)
            return
        over = len(self._queue) + len(lines) - self._buffer
        if over > 0:
            for _ in range(min(over, len(self._queue))):
                self._queue.popleft()
            self.dropped += over
            self._warnings.warn(
                "full", "decision logs: the HTTP sink's buffer is full (%d); dropping the oldest events (%d so far)", self._buffer, self.dropped
            )
        self._queue.extend(lines[-self._buffer :])
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._consume(), name="decision logs http")

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "retried": self.retried, "failed": self.failed, "dropped": self.dropped, "queued": self.queued}

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 -- a grace period: after it the rest is cancelled
        """Send what is queued for up to ``timeout`` seconds, then give up on the rest (logged)."""
        self._closing = True
        self._wake.set()
        if self._task is not None and not self._task.done():
            _, pending = await asyncio.wait([self._task], timeout=max(0.0, timeout))
            for task in pending:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.queued:
            log.warning("decision logs: %d events left unsent at close", self.queued)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- sending -----------------------------------------------------------------------------

    async def _consume(self) -> None:
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
            batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
            self._in_flight = len(batch)
            try:
                await self._deliver(batch)
            except asyncio.CancelledError:
                raise  # in flight still: close() counts it as unsent
            except Exception as error:  # a bug here must not end the deliveries
                self.failed += len(batch)
                log.error("decision logs: sending %d events failed unexpectedly (%s)", len(batch), type(error).__name__)
            self._in_flight = 0

    async def _deliver(self, batch: list[bytes]) -> None:
        body = await asyncio.to_thread(gzip_array, batch) if len(batch) > 16 else gzip_array(batch)
        answer = AttemptOutcome()
        for number in range(1, self._max_attempts + 1):
            if number > 1:
                self.retried += 1
            answer = await self._attempt(body)
            if answer.delivered:
                self.sent += len(batch)
                return
            if not answer.retryable:
                self.failed += len(batch)
                self._warnings.warn("refused", "decision logs: the service refused %d events (%s); not retried", len(batch), answer.describe())
                return
            if number == self._max_attempts:
                break
            delay = backoff_delay(number, self._first_backoff, self._max_backoff)
            if answer.retry_after is not None:
                delay = min(answer.retry_after, self._max_backoff)
            log.debug("decision logs: attempt %d failed (%s); retrying in %.1fs", number, answer.describe(), delay)
            await self._sleep(delay)
        self.failed += len(batch)
        self._warnings.warn("gave_up", "decision logs: gave up on %d events after %d attempts (last: %s)", len(batch), self._max_attempts, answer.describe())

    async def _attempt(self, body: bytes) -> AttemptOutcome:
        headers = {"content-type": "application/json", "content-encoding": "gzip", "user-agent": USER_AGENT}
        if self._token is not None:
            headers["authorization"] = f"Bearer {self._token}"
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(self._url, data=body, headers=headers, allow_redirects=False, timeout=self._timeout) as response:
                return AttemptOutcome(status=response.status, retry_after=retry_after_seconds(response.headers.get("retry-after"), self._now()))
        except (aiohttp.ClientError, TimeoutError, OSError) as error:  # the class only: messages can hold the URL
            return AttemptOutcome(error=type(error).__name__, transient=not isinstance(error, aiohttp.InvalidURL))
