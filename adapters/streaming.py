"""An ASGI response for relayed streams that knows when the client has gone.

The body is pumped in one task while another waits for ``http.disconnect``; when the
client leaves first the pump is cancelled at whatever it awaits (usually the next
upstream read), which closes the upstream connection and runs the relay's
finalisation at once instead of whenever the next event would have arrived."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping

from starlette.types import Receive, Scope, Send


class RelayedStream:
    """``body`` must already have produced ``first``: a started generator is the only kind
    whose ``aclose()`` runs its ``finally`` (the relay's settlement and audit), and it is
    closed here whatever happens, even when the client leaves before the first byte."""

    def __init__(self, status: int, headers: Mapping[str, str], first: bytes, body: AsyncGenerator[bytes, None]) -> None:
        self.status = status
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._first = first
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when this task itself is cancelled (a shutdown's drain ran out): the pump
            # must stop iterating the body before the body can be closed.
            if not pump.done():
                pump.cancel()
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pump
            await self._body.aclose()

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        if self._first:
            await send({"type": "http.response.body", "body": self._first, "more_body": True})
        async for chunk in self._body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
