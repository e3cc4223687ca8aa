"""uvicorn's HTTP protocol with a deadline for request headers. uvicorn bounds the idle
time between keep-alive requests, but not how long a client may take to send one
request's headers: a client that drips them a byte at a time holds a connection (and
its buffer) forever. Here each request's headers must be complete within the deadline,
counted from the connection's start or the request's first byte; otherwise the
connection is closed. The body's own deadline is the gateway's (``read_body``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("portcullis.http")


class _HeaderDeadline(HttpToolsProtocol):
    header_timeout_seconds = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # a keep-alive connection's next request
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            log.info("closed a connection whose request headers did not arrive within %g seconds", self.header_timeout_seconds)
            self.transport.close()


def header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, with this deadline."""
    return type("HeaderDeadlineProtocol", (_HeaderDeadline,), {"header_timeout_seconds": seconds})
