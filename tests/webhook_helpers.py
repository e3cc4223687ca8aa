"""What the event and webhook suites share: a real aiohttp receiver that answers a
script of statuses, secrets in the Standard Webhooks form, and events settings checked
against the configuration schema."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from portcullis.adapters.events.config import WebhookConfig
from portcullis.engine import schemas

QUERY_TOKEN = "qs-token-never-logged"
WHSEC_A = "whsec_" + base64.b64encode(b"a" * 32).decode()
WHSEC_B = "whsec_" + base64.b64encode(b"b" * 32).decode()
BAD_SECRET = "whsec_" + base64.b64encode(b"hunter2-short").decode()
BASE = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}]}


def checked(section: dict[str, Any]) -> dict[str, Any]:
    """The section as config.py hands it over: checked against the real schema first."""
    schemas.check("config", {**BASE, "events": section})
    return section


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A real HTTP receiver: answers ``script``'s (status, headers) in order, then 200.
    ``hang`` holds every answer until the test ends (or ``hang`` seconds)."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (status, headers) answered in turn
    hang: float = 0.0
    received: list[Received] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook?token={QUERY_TOKEN}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(Received(request.path, {k.lower(): v for k, v in request.headers.items()}, await request.read()))
        if self.hang:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._release.wait(), self.hang)
        status, headers = self.script.pop(0) if self.script else (200, {})
        return web.Response(status=status, headers=headers)

    def numbers(self) -> list[int]:
        return [json.loads(item.body)["data"]["n"] for item in self.received]


def webhook(**overrides: Any) -> WebhookConfig:
    settings: dict[str, Any] = {"name": "ops", "url": "https://hooks.example/h?token=qs-token", "secret_env": "OPS_SECRET"}
    return WebhookConfig(**(settings | overrides))
