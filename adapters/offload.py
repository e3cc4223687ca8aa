"""CPU-heavy work on a large request, done on a worker thread so the event loop keeps
serving every other client. Two things besides the work itself would still stall the
loop, and are kept off it: garbage-collector passes over the request's million new
objects, and freeing them on the loop's thread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.json_bytes import compact
from portcullis.adapters.protocols.interfaces import Parse, WireProtocol
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.errors import GatewayError

T = TypeVar("T")

# Work on more than this many bytes (or characters) runs on a worker thread: below it,
# the thread hop costs more than the work. Set from ``limits.offload_bytes`` at start-up.
threshold = 262_144


# One worker: the work holds the GIL, so more threads would not finish it sooner, and each
# thread's allocator arena keeps the memory of the large bodies it handled.
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="portcullis-offload")


def configure(offload_bytes: int) -> None:
    global threshold
    threshold = offload_bytes


async def off_loop(size: int, work: Callable[..., T], *args: object) -> T:
    """``work(*args)``, on a worker thread when ``size`` is over the threshold. Only for
    pure work: no regorus engine (unsendable across threads), no event-loop objects."""
    if size <= threshold:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(_worker, _paused, work, *args)


async def serialised(body: dict[str, object], size: int) -> bytes:
    """A changed request body as the bytes that go upstream (compact, UTF-8), written
    off the loop when it is large (``size``: the body's size as it arrived)."""
    return await off_loop(size, compact, body)


def _paused(work: Callable[..., T], *args: object) -> T:
    with collector_paused():
        return work(*args)


_pauses = 0
_resume = False
_pauses_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off during the work. A parsed JSON document has no
    cycles, so the collector finds nothing in it; but each of its passes over a large one
    stops every thread, the event loop's included (measured: ~100 ms for a 15 MB body).
    Re-entrant across threads; a collector that was already off stays off."""
    global _pauses, _resume
    with _pauses_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


def parse_apart(
    protocol: WireProtocol, raw: bytes, headers: Mapping[str, str], query: str, limits: RequestLimits, path: Mapping[str, str], parse: Parse | None = None
) -> tuple[ParsedRequest | None, GatewayError | None]:
    """``protocol.wire.parse`` (or the operation's ``parse``) for a worker thread. A refusal
    comes back without its traceback: the traceback's frames hold the parsed body, which
    must be freed here, not on the event loop."""
    with collector_paused():
        try:
            return (parse or protocol.wire.parse)(raw, headers, query, limits, path), None
        except GatewayError as refusal:
            refusal.__traceback__ = refusal.__context__ = None
            return None, refusal
