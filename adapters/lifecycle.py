"""What the served process needs to stop cleanly and to keep its audit log moving:
a uvicorn server that leaves signals to ``serve``, an app wrapper for requests the
shutdown drain cuts, and the audit log's periodic upkeep."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import uvicorn

from portcullis.adapters.audit_log import AuditLog
from portcullis.adapters.capture import BodyCapture

log = logging.getLogger("portcullis")

FINALIZE_SECONDS = 5.0  # after the drain: for cancelled requests to settle and record their outcome
AUDIT_TICK_SECONDS = 1.0  # how often held audit records are tried again, old files rotated, records forced to disk
CAPTURE_PURGE_SECONDS = 600.0  # how often expired body captures are deleted


class SignalFreeServer(uvicorn.Server):
    """uvicorn's server without its own signal capture: after serving it re-raises a
    captured SIGTERM with the default handler, which kills the process before the
    runtime is closed (exit 143). ``serve`` installs handlers that only ask it to stop.
    ``listening`` is set once its sockets accept connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()


class CancelledByShutdown:
    """An ASGI app that ends a request the server cancels (the shutdown drain ran out)
    with a log line instead of handing uvicorn a CancelledError to print as a traceback.
    Only the server cancels a request; a client that leaves is seen as a disconnect."""

    def __init__(self, app: Any, refusal: bytes) -> None:
        self._app = app
        self._refusal = refusal  # the JSON error for a request still waiting for its answer
        self.cut = 0  # requests ended this way

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, tracked)
        except asyncio.CancelledError:
            self.cut += 1
            log.warning("%s %s cancelled: the shutdown drain ran out", scope.get("method", "-"), scope.get("path", "-"))
            if not started:  # tell the client to retry elsewhere
                headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"), (b"x-portcullis-error-code", b"shutting_down")]
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": self._refusal, "more_body": False})
            # a stream already under way is left incomplete: the server closes its connection


async def tend_audit(audit: AuditLog) -> None:
    """Held audit records reach the disk soon after it recovers, an old file rotates and
    written records are forced to the disk, with or without traffic."""
    while True:
        await asyncio.sleep(AUDIT_TICK_SECONDS)
        try:
            await audit.tick()
        except OSError as error:  # the next tick tries again; a write path failure is the log's own to report
            log.error("audit log upkeep failed: %s", error.strerror)


async def purge_captures(capture: BodyCapture) -> None:
    """Captures past their retention are deleted by the gateway itself, on a thread (a
    directory scan), so retention holds without a job of its own beside it."""
    while True:
        try:
            deleted = await asyncio.to_thread(capture.purge, dt.datetime.now(dt.UTC))
        except OSError as error:  # the next round tries again
            log.error("purging expired captures failed: %s", error.strerror)
        else:
            if deleted:
                log.info("purged %d expired captures", deleted)
        await asyncio.sleep(CAPTURE_PURGE_SECONDS)
