"""The gateway's ASGI app for servers that import an app by path (granian), so
``bench.servers`` can measure the gateway under another server than the uvicorn
``portcullis serve`` runs. Built from the gateway's own ``build_runtime`` and
``create_app`` at ASGI lifespan start-up, on the server's loop, from the configuration
named by ``BENCH_GATEWAY_CONFIG``; closed at lifespan shutdown.

This is a benchmark harness, not a way to serve: ``serve()`` also runs the bundle
watcher, the audit retrier, signal handling and the shutdown drain, none of which a
short load run needs."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

CONFIG_ENV = "BENCH_GATEWAY_CONFIG"
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class GatewayApp:
    def __init__(self) -> None:
        self.app: Any = None
        self.runtime: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as error:  # the server reports it and stops
                    await send({"type": "lifespan.startup.failed", "message": f"{type(error).__name__}: {error}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.runtime is not None:
                    await self.runtime.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        from portcullis.adapters.app import create_app
        from portcullis.adapters.config import load_config
        from portcullis.adapters.runtime import build_runtime

        self.runtime = await build_runtime(load_config(Path(os.environ[CONFIG_ENV])))
        self.app = create_app(self.runtime)


app = GatewayApp()
