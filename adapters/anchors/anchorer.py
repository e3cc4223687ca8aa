"""The task that anchors the audit chain's head: about once a second it looks whether an
anchor is due for each sink (records were written since that sink's last anchor, and
``every_records`` of them or ``every_seconds`` have gone by), forces the log to the disk
(an anchor never vouches for a record the disk could still lose), and writes the head
to every sink that is due, each in a task of its own: a slow or failing sink holds up
no other. A failing sink is tried again with exponential backoff (1 s doubling to 5
minutes), with the newest head each time; a failure is logged when a sink starts to
fail and when it works again, not at every attempt.

Wiring: run ``run()`` as a background task once the log is open; at shutdown, after the
last record is appended and before ``AuditLog.close()``, ``await close()``: it anchors
the final head (bounded time) and closes the sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from portcullis.adapters.anchors.base import AnchorSink, AnchorSinkError
from portcullis.adapters.audit_config import AnchorConfig
from portcullis.adapters.audit_log import AuditLog
from portcullis.engine.audit_anchors import Anchor

log = logging.getLogger("portcullis.anchors")

CHECK_SECONDS = 1.0
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 300.0
CLOSE_SECONDS = 5.0
WRITE_SECONDS = 30.0  # a write that takes longer (a stuck mount, a silent endpoint) counts as failed
SINK_CLOSE_SECONDS = 2.0


@dataclass(frozen=True)
class AnchorSinkStats:
    anchored_seq: int  # the last seq this sink took in this process (0: none yet)
    lag_records: int  # head seq minus anchored_seq
    failures: int  # failed writes since start (a counter)
    failing: bool  # the last write failed


@dataclass
class _Lane:
    sink: AnchorSink
    anchored_seq: int | None = None  # None: nothing anchored to this sink by this process yet
    anchored_at: float = 0.0  # on the injected monotonic clock
    failures: int = 0
    consecutive: int = 0  # failures since the last success: the backoff's exponent
    retry_at: float = 0.0
    writing: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.writing is not None and not self.writing.done()


class Anchorer:
    def __init__(
        self,
        audit: AuditLog,
        sinks: Sequence[AnchorSink],
        config: AnchorConfig,
        now: Callable[[], float] = time.monotonic,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        write_timeout: float = WRITE_SECONDS,
    ) -> None:
        self._audit = audit
        self._lanes = [_Lane(sink) for sink in sinks]
        self._config = config
        self._now = now
        self._clock = clock
        self._write_timeout = write_timeout
        self._runner: asyncio.Task[None] | None = None
        self._sync_failing = False

    # --- metrics -------------------------------------------------------------------

    def stats(self) -> dict[str, AnchorSinkStats]:
        """Per sink (by name): what it holds, how far behind the head it is, how often it failed."""
        head = self._audit.head.seq
        return {
            lane.sink.name: AnchorSinkStats(lane.anchored_seq or 0, head - (lane.anchored_seq or 0), lane.failures, lane.consecutive > 0)
            for lane in self._lanes
        }

    @property
    def lag_records(self) -> int:
        """Records the furthest-behind sink does not vouch for yet (0 with no sinks)."""
        return max((stats.lag_records for stats in self.stats().values()), default=0)

    @property
    def last_anchored_seq(self) -> int:
        """The newest seq some sink holds an anchor of (written by this process; 0: none)."""
        return max((lane.anchored_seq or 0 for lane in self._lanes), default=0)

    @property
    def failures(self) -> dict[str, int]:
        return {lane.sink.name: lane.failures for lane in self._lanes}

    # --- anchoring -----------------------------------------------------------------

    async def run(self) -> None:
        """Check at once (a restart is vouched for within a second), then every second."""
        self._runner = asyncio.current_task()
        while True:
            try:
                await self.check()
            except Exception as error:  # a bug here must not end anchoring for good: logged, checked again
                log.error("audit anchors: a check failed unexpectedly (%s)", type(error).__name__)
            await asyncio.sleep(CHECK_SECONDS)

    async def check(self) -> list[asyncio.Task[None]]:
        """One look: the head, forced to the disk, written to each sink it is due for.
        Returns the writes started (they run on; ``run`` does not wait for them)."""
        head_seq, now = self._audit.head.seq, self._now()
        due = [lane for lane in self._lanes if not lane.busy and self._due(lane, head_seq, now)]
        if not due:
            return []
        anchor = await self._anchor()
        if anchor is None:
            return []
        for lane in due:
            lane.writing = asyncio.get_running_loop().create_task(self._write(lane, anchor), name=f"anchor {lane.sink.name}")
        return [lane.writing for lane in due if lane.writing is not None]

    def _due(self, lane: _Lane, head_seq: int, now: float) -> bool:
        if head_seq == 0 or now < lane.retry_at:
            return False
        if lane.anchored_seq is None:
            # The head found at start-up is anchored at once, before the every_* rules: a
            # restart is when a log rewritten while the gateway was down would go on
            # unnoticed, and anchoring it bounds that to what happened before the start.
            return True
        if head_seq <= lane.anchored_seq:
            return False
        if lane.consecutive:  # a failing sink catches up as soon as its backoff allows
            return True
        return head_seq - lane.anchored_seq >= self._config.every_records or now - lane.anchored_at >= self._config.every_seconds

    async def _anchor(self) -> Anchor | None:
        try:
            head = await self._audit.synced_head()
        except OSError as error:  # the next check tries again
            if not self._sync_failing:
                log.error("audit anchors: the log could not be forced to the disk (%s); not anchoring until it can", error.strerror)
            self._sync_failing = True
            return None
        if self._sync_failing:
            log.info("audit anchors: the log reaches the disk again")
            self._sync_failing = False
        stamp = self._clock().astimezone(dt.UTC).isoformat(timespec="milliseconds")
        return Anchor(head.seq, head.hash, stamp, self._config.chain)

    async def _write(self, lane: _Lane, anchor: Anchor) -> None:
        try:
            await asyncio.wait_for(lane.sink.write(anchor), self._write_timeout)
        except Exception as error:
            # A sink's own errors are safe to log; anything else may carry a URL or a key: its class only.
            if isinstance(error, TimeoutError):
                why = f"no answer within {self._write_timeout:g} s"
            else:
                why = str(error) if isinstance(error, AnchorSinkError) else f"{type(error).__name__} (unexpected)"
            lane.failures += 1
            lane.consecutive += 1
            delay = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** min(lane.consecutive - 1, 32))
            lane.retry_at = self._now() + delay
            if lane.consecutive == 1:
                log.warning("audit anchor sink %s failed (%s); retrying with backoff, seq %d is not anchored there yet", lane.sink.name, why, anchor.seq)
            else:
                log.debug("audit anchor sink %s failed again (%s); next try in %.0f s", lane.sink.name, why, delay)
            return
        if lane.consecutive:
            log.info("audit anchor sink %s works again after %d failed writes (anchored seq %d)", lane.sink.name, lane.consecutive, anchor.seq)
        lane.consecutive, lane.retry_at = 0, 0.0
        lane.anchored_seq = max(lane.anchored_seq or 0, anchor.seq)
        lane.anchored_at = self._now()

    # --- closing -------------------------------------------------------------------

    async def close(self, timeout: float = CLOSE_SECONDS) -> None:  # noqa: ASYNC109 -- a grace period: the sinks close after it either way
        """Stop checking; let writes under way finish, then anchor the head to each sink
        that does not hold it yet (backoff or not: it is the last chance), all within
        ``timeout`` seconds; then close the sinks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._runner is not None and self._runner is not asyncio.current_task() and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self._wait([lane.writing for lane in self._lanes if lane.busy and lane.writing], deadline)
        head = self._audit.head.seq
        final = [lane for lane in self._lanes if not lane.busy and head > (lane.anchored_seq or 0)]
        if final and loop.time() < deadline:
            try:
                anchor = await asyncio.wait_for(self._anchor(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                anchor = None
            if anchor is not None:
                for lane in final:
                    lane.writing = loop.create_task(self._write(lane, anchor), name=f"anchor {lane.sink.name}")
                await self._wait([lane.writing for lane in final if lane.writing], deadline)
        for lane in self._lanes:
            if lane.busy and lane.writing:
                lane.writing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await lane.writing
            if head > (lane.anchored_seq or 0):
                log.warning(
                    "audit anchor sink %s: closed holding seq %d of %d; the records after it are vouched for by the chain only",
                    lane.sink.name,
                    lane.anchored_seq or 0,
                    head,
                )
            try:
                await asyncio.wait_for(lane.sink.close(), SINK_CLOSE_SECONDS)
            except Exception as error:
                log.warning("audit anchor sink %s did not close cleanly (%s)", lane.sink.name, type(error).__name__)

    @staticmethod
    async def _wait(tasks: list[asyncio.Task[None]], deadline: float) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if tasks and remaining > 0:
            await asyncio.wait(tasks, timeout=remaining)
