"""The fake provider's server: one Starlette app answering every wire format in
``WIRE_FORMATS``, per-model scripts, the record of what it received and the accepted
credentials (each format module checks them the way its real API does)."""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from types import ModuleType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes import anthropic_messages, bedrock_runtime, openai_chat, openai_responses
from tests.fakes.behaviours import Behaviour, Received, Reply
from tests.fakes.sigv4 import AwsAccount
from tests.fakes.wire import model_of

# One module per wire format, each with its ``PATH`` and ``async handle(fake, request)``.
WIRE_FORMATS: tuple[ModuleType, ...] = (anthropic_messages, openai_chat, openai_responses, bedrock_runtime)


class FakeProvider:
    def __init__(self, api_key: str = "sk-fake-upstream", name: str = "fake", default: Reply | None = None, region: str = "us-east-1") -> None:
        self.api_key = api_key
        self.region = region
        self.aws = AwsAccount(region)  # Bedrock's: the access keys it accepts, its region and account id
        self.default = default or Reply()  # what an unscripted request gets
        self.accepted_keys = {api_key}  # a provider account can hold several keys
        self.name = name
        self.id_tag = ""  # put in each answer's id: which pod of a pool served it (``pods``)
        self.metrics: dict[str, float] = {}  # what GET /metrics reports, in Prometheus text format
        self.metrics_status = 200
        self.received: list[Received] = []
        self._scripts: dict[str, collections.deque[Behaviour]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        routes = [(wire.PATH, wire.handle) for wire in WIRE_FORMATS] + [route for wire in WIRE_FORMATS for route in getattr(wire, "MORE_ROUTES", {}).items()]
        self.app = Starlette(
            routes=[Route(path, self._endpoint(handler), methods=["POST"]) for path, handler in routes]
            + [Route("/metrics", self._metrics, methods=["GET"]), Route("/fake/metrics", self._set_metrics, methods=["PUT"])]
        )

    # --- test-side controls -------------------------------------------------------------

    def script(self, model: str, *behaviours: Behaviour) -> None:
        """Queue behaviours for requests naming this upstream model; then default replies."""
        with self._lock:
            self._scripts[model].extend(behaviours)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.received.clear()
            self.accepted_keys = {self.api_key}
            self.aws = AwsAccount(self.region)
            self.metrics = {}
            self.metrics_status = 200

    def requests_for(self, model: str) -> list[Received]:
        return [r for r in self.received if (r.model if r.model is not None else model_of(r.body)) == model]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeProvider:
        self.port = port or free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"fake-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake provider did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the wire formats' side -----------------------------------------------------------

    def next_behaviour(self, model: str) -> Behaviour:
        """What the next request naming ``model`` gets: its script's head, else the default."""
        with self._lock:
            queue = self._scripts.get(model)
            return queue.popleft() if queue else self.default

    async def _metrics(self, request: Request) -> Response:
        with self._lock:
            values, status = dict(self.metrics), self.metrics_status
        lines = [f'{name}{{model_name="fake",engine="0"}} {value}' for name, value in sorted(values.items())]
        return Response("# HELP fake metrics\n" + "".join(line + "\n" for line in lines), status, media_type="text/plain; version=0.0.4")

    async def _set_metrics(self, request: Request) -> Response:
        """The control side for a fake run standalone: ``PUT /fake/metrics {"name": value}``."""
        values = await request.json()
        with self._lock:
            self.metrics = {str(name): float(value) for name, value in values.items()}
        return Response(status_code=204)

    def _endpoint(self, handler: Callable[[FakeProvider, Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        # A plain function, not a partial: Starlette treats anything else as an ASGI app.
        async def endpoint(request: Request) -> Response:
            return await handler(self, request)

        return endpoint


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
