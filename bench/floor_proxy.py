"""The floor: the thinnest proxy Python serves, for the headline benchmark to measure the
gateway against. A raw ASGI app (no framework, no routing, no policy) that forwards each
request, method, path, headers and body, to one upstream through one aiohttp
``ClientSession`` and relays the answer as it arrives (streams chunk by chunk).

Whatever the gateway costs beyond this row is its own work; what this row costs beyond
upstream direct is the server, the event loop and the upstream client.

    python -m bench.floor_proxy --port 9000 --upstream http://127.0.0.1:8999
    python -m bench.floor_proxy --port 9000 --upstream … --server granian
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
UPSTREAM_ENV = "BENCH_FLOOR_UPSTREAM"
# Hop-by-hop headers and the ones the client library and the server set themselves.
NOT_FORWARDED = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})
NOT_RELAYED = frozenset({b"transfer-encoding", b"connection", b"keep-alive", b"date", b"server"})


class FloorProxy:
    """Forwards every HTTP request to ``upstream``; answers lifespan messages so any
    ASGI server (uvicorn, granian) can run it."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        # Created on the serving loop's first request: a session belongs to one loop.
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
            self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60))
        return self.session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"] if name not in NOT_FORWARDED]
        url = self.upstream + scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
        try:
            async with self._session().request(scope["method"], url, data=bytes(body), headers=headers) as answer:
                relayed = [(name.lower(), value) for name, value in answer.raw_headers if name.lower() not in NOT_RELAYED]
                await send({"type": "http.response.start", "status": answer.status, "headers": relayed})
                async for chunk in answer.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except aiohttp.ClientError:
            await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"upstream unreachable"})


# For servers started by import path (granian): the upstream comes from the environment.
app = FloorProxy(os.environ.get(UPSTREAM_ENV, "http://127.0.0.1:1"))


def command(port: int, upstream: str, server: str = "uvicorn") -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve the floor on ``port``."""
    environment = {**os.environ, UPSTREAM_ENV: upstream}
    if server == "granian":
        granian = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)]
        return [*granian, "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning", "bench.floor_proxy:app"], environment
    return [sys.executable, "-m", "bench.floor_proxy", "--port", str(port), "--upstream", upstream], environment


def start(port: int, upstream: str, server: str, log: Any, cwd: str) -> subprocess.Popen:
    arguments, environment = command(port, upstream, server)
    return subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=cwd)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="The thinnest aiohttp proxy (the benchmark's floor).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(
        FloorProxy(args.upstream), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", lifespan="on", access_log=False, log_level="warning"
    )


if __name__ == "__main__":
    main()
