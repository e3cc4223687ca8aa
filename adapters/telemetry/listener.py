"""``GET /metrics`` on a listener of its own, apart from the port clients use.

Deliberately tiny (HTTP/1.1, one request per connection, GET only): it serves a scraper,
and it runs in the supervisor as well as in a gateway process, so it brings no web
framework with it. With a bearer token configured, a request without that token gets a
401 and nothing else: the metrics name teams and models, which is the organisation's
business. Nothing a scraper sends is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable

from portcullis.adapters.telemetry.prometheus import CONTENT_TYPE

log = logging.getLogger("portcullis.metrics")

MAX_HEAD_BYTES = 8192
READ_SECONDS = 5.0


def authorised(header: str | None, token: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (any request, when none is set)."""
    if token is None:
        return True
    scheme, _, presented = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


class MetricsListener:
    def __init__(self, render: Callable[[], str], token: str | None) -> None:
        self._render = render
        self._token = token
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port actually bound (``port`` 0 picks one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_SECONDS)
            status, body, extra = self._answer(head.decode("latin-1"))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ValueError):
            status, body, extra = 400, b"bad request\n", ""
        try:
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: {CONTENT_TYPE if status == 200 else 'text/plain'}\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, head: str) -> tuple[int, bytes, str]:
        request_line, *header_lines = head.split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines if line)}
        if target.split("?", 1)[0] != "/metrics":
            return 404, b"not found: this listener serves GET /metrics\n", ""
        if method != "GET":
            return 405, b"method not allowed\n", "allow: GET\r\n"
        if not authorised(headers.get("authorization"), self._token):
            return 401, b"unauthorized\n", 'www-authenticate: Bearer realm="portcullis-metrics"\r\n'
        return 200, self._render().encode(), ""


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}
