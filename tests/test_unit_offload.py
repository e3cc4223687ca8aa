"""The off-loop helpers: large work moves to a worker thread, small work stays inline, and
the collector pause nests across threads without turning a disabled collector back on."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from portcullis.adapters import offload
from portcullis.adapters.protocols.anthropic_messages import PROTOCOL as anthropic_messages
from portcullis.adapters.protocols.request import DEFAULT_LIMITS


def test_work_over_the_threshold_runs_on_a_worker_thread() -> None:
    async def thread_of(size: int) -> str:
        return await offload.off_loop(size, lambda: threading.current_thread().name)

    main = threading.current_thread().name
    assert asyncio.run(thread_of(offload.threshold)) == main
    assert asyncio.run(thread_of(offload.threshold + 1)) != main


def test_the_collector_pause_nests_and_restores_the_state_it_found() -> None:
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with offload.collector_paused():
            entered.set()
            release.wait(5)

    worker = threading.Thread(target=hold)
    worker.start()
    entered.wait(5)
    with offload.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    worker.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with offload.collector_paused():
            pass
        assert not gc.isenabled()  # an operator's choice is kept
    finally:
        gc.enable()


def test_a_refusal_from_the_worker_comes_back_without_the_parsed_body() -> None:
    raw = b'{"model": "m", "max_tokens": 5, "messages": [{"role": ["user"], "content": "x"}]}'
    parsed, refusal = offload.parse_apart(anthropic_messages, raw, {}, "", DEFAULT_LIMITS, {})
    assert parsed is None and refusal is not None
    assert refusal.__traceback__ is None and refusal.__context__ is None  # the frames that held the body are gone
    assert refusal.message == "messages[0].role: expected a string, got an array"
    with pytest.raises(AttributeError):  # a gateway bug is not turned into a refusal
        offload.parse_apart(anthropic_messages, b'{"model": "m", "max_tokens": 5, "messages": []}', {}, "", None, {})  # type: ignore[arg-type]
