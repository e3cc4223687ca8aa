"""Fact sources are gathered side by side, so the shared store's reads (a session's
pin, a budget's peak, the breakers) overlap instead of queueing: a source that fails
is still left out and logged by its error's type alone, the others are still in, a
source that reads another's fact still sees it, and the facts keep the sources'
order. ``together`` starts no task for a coroutine that never waits."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.pipeline import Exchange, FactSource
from portcullis.adapters.together import together
from tests.test_unit_executor import Harness, ScriptedProvider
from tests.test_unit_executor_routing import bundle  # noqa: F401  (the module's bundle fixture)

WAIT = 0.2


class Waiting(FactSource):
    """A source whose read takes ``WAIT`` seconds, as a store's would under load."""

    def __init__(self, name: str, fact: Any, fails: bool = False, reads: tuple[str, ...] = ()) -> None:
        self.name, self.fact, self.fails, self.reads = name, fact, fails, reads  # type: ignore[misc]
        self.saw: dict[str, Any] | None = None
        self.exchange: Exchange | None = None
        self.decided_at: float | None = None

    async def gather(self, exchange: Exchange) -> Any:
        self.saw, self.exchange = dict(exchange.facts), exchange
        await asyncio.sleep(WAIT)
        if self.fails:
            raise RuntimeError("the store said: secret prompt text")
        return self.fact

    async def decided(self, exchange: Exchange) -> None:
        await asyncio.sleep(WAIT)
        self.decided_at = time.monotonic()


def test_sources_are_gathered_side_by_side_and_a_failing_one_is_left_out(tmp_path: Path, bundle: Any, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    first, failing, third = Waiting("first", {"a": 1}), Waiting("failing", {"b": 2}, fails=True), Waiting("third", {"c": 3})
    reader = Waiting("reader", {"d": 4}, reads=("first",))
    sources = (first, reader, failing, third)
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"), facts=sources)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR):
        assert harness.run().status_code == 200
    elapsed = time.monotonic() - started
    # Gathered in two rounds (the reader after the source it reads), then the four decisions at once.
    assert elapsed < 5 * WAIT, elapsed
    assert reader.saw == {"first": {"a": 1}, "third": {"c": 3}}  # it saw the fact it reads
    assert first.saw == failing.saw == third.saw == {}
    assert reader.exchange is not None
    assert list(reader.exchange.facts.items()) == [("first", {"a": 1}), ("reader", {"d": 4}), ("third", {"c": 3})]  # the sources' order
    assert "the failing fact could not be gathered: RuntimeError" in caplog.text
    assert "secret" not in caplog.text
    decided = [source.decided_at for source in sources]
    assert all(decided) and max(decided) - min(decided) < WAIT  # type: ignore[type-var, operator]


def test_together_keeps_the_order_and_overlaps_the_waits() -> None:
    async def after(seconds: float, value: str) -> str:
        await asyncio.sleep(seconds)
        return value

    async def at_once(value: str) -> str:
        return value

    async def main() -> None:
        started = time.monotonic()
        assert await together([after(WAIT, "slow"), at_once("now"), after(WAIT / 2, "soon")]) == ["slow", "now", "soon"]
        assert time.monotonic() - started < 1.5 * WAIT
        assert await together([]) == []

    asyncio.run(main())


def test_together_starts_no_task_for_coroutines_that_do_not_wait() -> None:
    async def main() -> None:
        created: list[Any] = []
        loop = asyncio.get_running_loop()
        loop.set_task_factory(lambda loop, coro, **kwargs: created.append(coro) or asyncio.Task(coro, loop=loop, **kwargs))

        async def now(value: int) -> int:
            return value

        async def waits(value: int) -> int:
            await asyncio.sleep(0)
            return value

        assert await together([now(1), now(2), now(3)]) == [1, 2, 3]
        assert await together([now(1), waits(2), now(3)]) == [1, 2, 3]  # one that waits is awaited in place
        assert created == []
        assert await together([waits(1), waits(2)]) == [1, 2]
        assert len(created) == 2

    asyncio.run(main())


def test_a_cancellation_reaches_the_coroutines_together_waits_for() -> None:
    cleaned: list[str] = []

    async def held(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    async def main() -> None:
        for names in (["alone"], ["one", "two"]):
            task = asyncio.create_task(together([held(name) for name in names]))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert cleaned == ["alone", "one", "two"]

    asyncio.run(main())


def test_each_coroutine_runs_in_a_context_of_its_own() -> None:
    """As under tasks: what one coroutine sets in a context variable neither leaks into
    the caller nor into the others, before or after its first wait."""
    current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="caller")

    async def sets(name: str, waits: bool) -> tuple[str, str]:
        before = current.get()
        current.set(name)
        if waits:
            await asyncio.sleep(0.01)
        return before, current.get()

    async def main() -> None:
        assert await together([sets("a", True), sets("b", False), sets("c", True)]) == [("caller", "a"), ("caller", "b"), ("caller", "c")]
        assert await together([sets("d", True)]) == [("caller", "d")]
        assert current.get() == "caller"

    asyncio.run(main())
