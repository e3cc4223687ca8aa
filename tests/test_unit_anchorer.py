"""The anchorer over a real audit log and sinks of the tests' own: the head found at
start is anchored at once; then an anchor is due after ``every_records`` records or
``every_seconds`` (an injected clock) with records written; a failing or hanging sink
holds up no other; a failing one backs off exponentially and is logged once per change
of state, never with what an unexpected error said; close anchors the final head within
its time and closes every sink; the lag and failure numbers say where each sink is."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from portcullis.adapters.anchors.anchorer import MAX_BACKOFF_SECONDS, Anchorer
from portcullis.adapters.anchors.base import AnchorSinkError
from portcullis.adapters.audit_config import AnchorConfig
from portcullis.adapters.audit_log import AuditLog, AuditWriting
from portcullis.engine.audit_anchors import Anchor
from tests.audit_helpers import all_records, write_records

CHAIN = "gw:audit.jsonl"


@dataclass
class Sink:
    """Records what it is given; ``fail`` raises instead, ``hang`` waits until released."""

    name: str
    fail: BaseException | None = None
    hang: bool = False
    written: list[Anchor] = field(default_factory=list)
    attempts: int = 0
    closed: bool = False
    release: asyncio.Event | None = None

    async def write(self, anchor: Anchor) -> None:
        self.attempts += 1
        if self.hang:
            self.release = self.release or asyncio.Event()
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        self.written.append(anchor)

    async def close(self) -> None:
        self.closed = True


@dataclass
class Clock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


def audit_log(tmp_path: Path, records: int = 0) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl", writing=AuditWriting(fsync="never"))
    write_records(log, records)
    return log


def anchorer(log: AuditLog, sinks: list[Sink], clock: Clock, every_records: int = 10, every_seconds: float = 60.0) -> Anchorer:
    return Anchorer(log, sinks, AnchorConfig(CHAIN, (), every_records, every_seconds), now=clock)


async def check(anchoring: Anchorer) -> None:
    """One look, and the writes it started, finished."""
    await asyncio.gather(*await anchoring.check())


def test_the_head_found_at_start_is_anchored_at_once_and_an_empty_log_is_not(tmp_path: Path) -> None:
    log, sink, clock = audit_log(tmp_path, 5), Sink("a"), Clock()
    asyncio.run(check(anchorer(log, [sink], clock)))
    record = all_records(log.path)[-1]
    assert sink.written == [Anchor(5, record["hash"], sink.written[0].ts, CHAIN)]
    assert sink.written[0].ts.endswith("+00:00") and "T" in sink.written[0].ts
    empty, other = audit_log(tmp_path / "empty"), Sink("b")
    asyncio.run(check(anchorer(empty, [other], clock)))
    assert other.attempts == 0
    log.close()
    empty.close()


def test_an_anchor_is_due_after_every_records_records(tmp_path: Path) -> None:
    log, sink, clock = audit_log(tmp_path, 5), Sink("a"), Clock()
    anchoring = anchorer(log, [sink], clock, every_records=10)

    async def scenario() -> None:
        await check(anchoring)
        write_records(log, 9)
        await check(anchoring)
        assert [a.seq for a in sink.written] == [5]
        write_records(log, 1)
        await check(anchoring)
        assert [a.seq for a in sink.written] == [5, 15]
        await check(anchoring)  # nothing new: no anchor
        assert [a.seq for a in sink.written] == [5, 15]

    asyncio.run(scenario())
    log.close()


def test_an_anchor_is_due_after_every_seconds_with_records_written(tmp_path: Path) -> None:
    log, sink, clock = audit_log(tmp_path, 1), Sink("a"), Clock()
    anchoring = anchorer(log, [sink], clock, every_records=1000, every_seconds=60)

    async def scenario() -> None:
        await check(anchoring)
        clock.t += 120  # time alone, with nothing written, anchors nothing
        await check(anchoring)
        assert [a.seq for a in sink.written] == [1]
        write_records(log, 1)  # the first record after a quiet minute is anchored at the next look
        await check(anchoring)
        assert [a.seq for a in sink.written] == [1, 2]
        write_records(log, 2)
        clock.t += 59
        await check(anchoring)
        assert [a.seq for a in sink.written] == [1, 2]
        clock.t += 1
        await check(anchoring)
        assert [a.seq for a in sink.written] == [1, 2, 4]

    asyncio.run(scenario())
    log.close()


def test_a_failing_or_hanging_sink_holds_up_no_other(tmp_path: Path) -> None:
    log, clock = audit_log(tmp_path, 3), Clock()
    failing, hanging, good = Sink("down", fail=AnchorSinkError("down: answered HTTP 503")), Sink("slow", hang=True), Sink("up")
    anchoring = anchorer(log, [failing, hanging, good], clock, every_records=2)

    async def scenario() -> None:
        started = await anchoring.check()
        await asyncio.wait_for(asyncio.gather(started[0], started[2]), 1)
        write_records(log, 2)
        await asyncio.wait_for(check(anchoring), 1)  # the hanging write is not waited for, nor started again
        assert [a.seq for a in good.written] == [3, 5] and hanging.attempts == 1
        stats = anchoring.stats()
        assert stats["down"].failing and stats["down"].failures == 1 and stats["down"].anchored_seq == 0
        assert stats["up"].lag_records == 0 and not stats["up"].failing
        assert hanging.release is not None
        hanging.release.set()
        await asyncio.sleep(0)
        await anchoring.close(timeout=1)

    asyncio.run(asyncio.wait_for(scenario(), 5))  # a sink that held up the others would hang here
    assert failing.closed and hanging.closed and good.closed
    log.close()


def test_a_write_that_never_answers_counts_as_failed_and_is_tried_again(tmp_path: Path) -> None:
    log, clock = audit_log(tmp_path, 3), Clock()
    stuck = Sink("stuck", hang=True)
    anchoring = Anchorer(log, [stuck], AnchorConfig(CHAIN, (), 10, 60.0), now=clock, write_timeout=0.05)

    async def scenario() -> None:
        await asyncio.wait_for(check(anchoring), 1)
        stats = anchoring.stats()["stuck"]
        assert stats.failing and stats.failures == 1 and stats.anchored_seq == 0  # the gauge and the alert see it
        clock.t += 1.5  # past the first backoff
        stuck.hang, stuck.release = False, None
        await check(anchoring)
        assert [a.seq for a in stuck.written] == [3] and not anchoring.stats()["stuck"].failing

    asyncio.run(scenario())
    log.close()


def test_a_failing_sink_backs_off_exponentially_and_is_logged_once_per_change(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log, clock = audit_log(tmp_path, 3), Clock()
    sink = Sink("down", fail=AnchorSinkError("down: answered HTTP 503"))
    anchoring = anchorer(log, [sink], clock)

    async def scenario() -> list[float]:
        tried_at = []
        for _ in range(200):  # 100 s in half seconds
            attempts = sink.attempts
            await check(anchoring)
            if sink.attempts > attempts:
                tried_at.append(clock.t - 1000)
            clock.t += 0.5
        clock.t += 10 * MAX_BACKOFF_SECONDS
        for _ in range(12):  # the delay stops growing at the cap
            attempts = sink.attempts
            await check(anchoring)
            assert sink.attempts == attempts + 1
            clock.t += MAX_BACKOFF_SECONDS
        sink.fail = None
        await check(anchoring)
        return tried_at

    with caplog.at_level(logging.DEBUG, logger="portcullis.anchors"):
        tried_at = asyncio.run(scenario())
    assert tried_at == [0, 1, 3, 7, 15, 31, 63]
    assert [a.seq for a in sink.written] == [3] and not anchoring.stats()["down"].failing
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "answered HTTP 503" in warnings[0].getMessage()
    assert any("works again after 19 failed writes" in r.getMessage() for r in caplog.records)
    log.close()


def test_an_unexpected_error_is_logged_by_its_class_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log, clock = audit_log(tmp_path, 1), Clock()
    sink = Sink("odd", fail=RuntimeError("https://user:hunter2@sink.example/?token=abc"))
    with caplog.at_level(logging.DEBUG, logger="portcullis.anchors"):
        asyncio.run(check(anchorer(log, [sink], clock)))
    assert "RuntimeError (unexpected)" in caplog.text and "hunter2" not in caplog.text and "token=abc" not in caplog.text
    log.close()


def test_close_anchors_the_final_head_then_closes_the_sinks(tmp_path: Path) -> None:
    log, clock = audit_log(tmp_path, 4), Clock()
    sink, backing_off = Sink("a"), Sink("b", fail=AnchorSinkError("b: down"))
    anchoring = anchorer(log, [sink, backing_off], clock, every_records=100)

    async def scenario() -> None:
        await check(anchoring)
        write_records(log, 3)
        log.append("gateway_stopped")
        backing_off.fail = None  # in backoff still: the final anchor is its last chance all the same
        await anchoring.close()

    asyncio.run(scenario())
    assert [a.seq for a in sink.written] == [4, 8] and [a.seq for a in backing_off.written] == [8]
    assert sink.written[-1].hash == all_records(log.path)[-1]["hash"]
    assert sink.closed and backing_off.closed
    log.close()


def test_close_writes_nothing_new_when_the_head_is_anchored_and_never_waits_past_its_time(tmp_path: Path) -> None:
    log, clock = audit_log(tmp_path, 2), Clock()
    sink, hanging = Sink("a"), Sink("slow", hang=True)
    anchoring = anchorer(log, [sink, hanging], clock)

    async def scenario() -> float:
        await anchoring.check()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await anchoring.close(timeout=0.3)
        return time.monotonic() - started

    assert asyncio.run(asyncio.wait_for(scenario(), 3)) < 1.5
    assert [a.seq for a in sink.written] == [2] and hanging.written == []
    assert sink.closed and hanging.closed
    log.close()


def test_lag_and_failure_numbers(tmp_path: Path) -> None:
    log, clock = audit_log(tmp_path, 5), Clock()
    good, bad = Sink("up"), Sink("down", fail=AnchorSinkError("down: no"))
    anchoring = anchorer(log, [good, bad], clock, every_records=100)

    async def scenario() -> None:
        assert anchoring.lag_records == 5 and anchoring.last_anchored_seq == 0
        await check(anchoring)
        write_records(log, 7)
        assert anchoring.last_anchored_seq == 5
        assert anchoring.lag_records == 12  # the sink that holds nothing
        assert {name: s.lag_records for name, s in anchoring.stats().items()} == {"up": 7, "down": 12}
        clock.t += 5
        await check(anchoring)
        assert anchoring.failures == {"up": 0, "down": 2}

    asyncio.run(scenario())
    log.close()


def test_run_anchors_at_once_and_close_stops_it(tmp_path: Path) -> None:
    log, sink = audit_log(tmp_path, 3), Sink("a")
    anchoring = Anchorer(log, [sink], AnchorConfig(CHAIN, ()))

    async def scenario() -> None:
        task = asyncio.ensure_future(anchoring.run())
        for _ in range(50):
            if sink.written:
                break
            await asyncio.sleep(0.01)
        assert [a.seq for a in sink.written] == [3]
        await anchoring.close()
        assert task.done()

    asyncio.run(scenario())
    assert sink.closed
    log.close()
