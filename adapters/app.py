"""The Starlette application over a ``Runtime`` (``runtime.py``), and serving it with
uvicorn until a signal stops it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from portcullis.adapters.config import Config
from portcullis.adapters.error_responses import error_response, generic_error_body
from portcullis.adapters.http_edge import RequestIds, family_of, protocol_error, request_id_for, route_error
from portcullis.adapters.http_timeouts import header_deadline_protocol
from portcullis.adapters.ingress import client_address
from portcullis.adapters.lifecycle import FINALIZE_SECONDS, CancelledByShutdown, SignalFreeServer, purge_captures, tend_audit
from portcullis.adapters.operations import Operation
from portcullis.adapters.protocols import anthropic_messages, openai_chat, openai_responses
from portcullis.adapters.protocols.registry import PATH_OPERATIONS, protocol
from portcullis.adapters.runtime import Runtime, build_runtime
from portcullis.adapters.store.state_host import READY
from portcullis.adapters.telemetry.prometheus import CONTENT_TYPE as PROMETHEUS_TEXT
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt

if TYPE_CHECKING:
    from portcullis.adapters.worker import WorkerLink

log = logging.getLogger("portcullis")


def create_app(runtime: Runtime) -> Starlette:
    gateway = runtime.gateway

    async def messages(request: Request) -> Any:
        return await gateway.handle(request, anthropic_messages.PROTOCOL)

    async def count_tokens(request: Request) -> Any:
        return await gateway.handle(request, anthropic_messages.PROTOCOL, Operation.COUNT_TOKENS)

    async def input_tokens(request: Request) -> Any:
        return await gateway.handle(request, openai_responses.PROTOCOL, Operation.COUNT_TOKENS)

    async def chat_completions(request: Request) -> Any:
        return await gateway.handle(request, openai_chat.PROTOCOL)

    async def responses(request: Request) -> Any:
        return await gateway.handle(request, openai_responses.PROTOCOL)

    async def bedrock_runtime(request: Request) -> Any:
        # The operation is the path's last segment; the model id before it may hold '/' (an ARN).
        name = PATH_OPERATIONS.get(request.path_params["action"])
        if name is None:
            return route_error(request, 404)
        return await gateway.handle(request, protocol(name))

    async def models(request: Request) -> Response:
        # One document both SDKs accept: OpenAI's list shape plus Anthropic's fields.
        protocol = anthropic_messages.PROTOCOL if "anthropic-version" in request.headers else openai_chat.PROTOCOL
        try:
            principal = await runtime.authenticator.authenticate(request.headers, client_address(request))
        except GatewayError as error:
            request_id = request_id_for(request.scope)
            return error_response(protocol.wire.error_body(error, request_id), error, request_id)
        bundle = runtime.bundles.active
        ids = bundle.visible_models(principal.as_input())
        data = [
            {
                "id": model,
                "object": "model",
                "type": "model",
                "created": 0,
                "created_at": "1970-01-01T00:00:00Z",
                "owned_by": "portcullis",
                "display_name": model,
                "aliases": bundle.aliases_of(model),
            }
            for model in ids
        ]
        return JSONResponse({"object": "list", "data": data, "has_more": False, "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        bundle = runtime.bundles.active
        return JSONResponse({"status": "ready", "bundle": {"revision": bundle.revision, "digest": bundle.digest}})

    async def metrics(request: Request) -> Response:
        if not runtime.telemetry.authorised(request.headers.get("authorization")):
            return Response("unauthorized\n", 401, headers={"www-authenticate": 'Bearer realm="portcullis-metrics"'}, media_type="text/plain")
        return Response(runtime.telemetry.render(), 200, media_type=PROMETHEUS_TEXT)

    async def root(request: Request) -> Response:
        return JSONResponse({"service": "portcullis"})  # coding agents probe HEAD / before their first call

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code in (404, 405):
            allowed = {name.lower(): value for name, value in (error.headers or {}).items()}.get("allow")
            return route_error(request, error.status_code, allowed)
        refusal = GatewayError(ErrorKind.INVALID_REQUEST, str(error.detail), code="invalid_request")
        return Response(generic_error_body(refusal), error.status_code, media_type="application/json")

    async def unexpected(request: Request, error: Exception) -> Response:
        # Outside the request-id middleware (Starlette runs this handler outermost), so the id is added here.
        request_id = request_id_for(request.scope)
        log.error("%s unexpected %s while serving %s %s", request_id, type(error).__name__, request.method, excerpt(request.url.path), exc_info=error)
        internal = GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error")
        response = protocol_error(family_of(request), internal, request_id)
        response.headers.update({"request-id": request_id, "x-portcullis-request-id": request_id})
        return response

    routes = [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/", messages, methods=["POST"]),  # served, not redirected: a redirect would be built from the Host header
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/messages/count_tokens/", count_tokens, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/chat/completions/", chat_completions, methods=["POST"]),
        # Codex may try a WebSocket on /v1/responses first: the HTTP edge answers the
        # upgrade 426, and it falls back to these at once.
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/responses/", responses, methods=["POST"]),
        Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
        Route("/v1/responses/input_tokens/", input_tokens, methods=["POST"]),
        Route("/model/{model:path}/{action}", bedrock_runtime, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        *([Route("/metrics", metrics, methods=["GET"])] if runtime.telemetry.on_serving_port else []),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(RequestIds)], exception_handlers={HTTPException: http_error, Exception: unexpected})
    app.router.redirect_slashes = False  # the redirect's Location would come from the client's Host header
    return app


async def _when_listening(server: SignalFreeServer, serving: asyncio.Future[None]) -> bool:
    """Until the server accepts connections (True), or it stopped first (False; a start-up
    failure is raised)."""
    listening = asyncio.ensure_future(server.listening.wait())
    await asyncio.wait({listening, serving}, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if serving.done():
        serving.result()  # a start-up failure is raised here, before anything is printed
    return server.listening.is_set()


async def serve(config: Config, on_ready: Any = None, worker: WorkerLink | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down cleanly: stop accepting connections,
    let requests and streams in flight finish for up to ``listen.drain_seconds``, cancel
    what remains (each still settles and records its outcome), close providers, stores
    and the audit log, and return (exit status 0). A second signal skips the drain.
    As one ``worker`` of several: listen on the supervisor's port, write this worker's own
    audit chain, use the hosted state (embedded store), and stop if the supervisor dies."""
    hosted = None
    if worker is not None:
        from portcullis.adapters.worker import worker_audit_path

        anchor = config.audit.anchor.for_worker(worker.index) if config.audit.anchor is not None else None
        audit = dataclasses.replace(config.audit, path=worker_audit_path(config.audit.path, worker.index), anchor=anchor)
        config = dataclasses.replace(config, audit=audit)
        traces = config.telemetry.traces
        if traces.path is not None:  # a file per worker, as its audit chain: processes never interleave a line
            traced = dataclasses.replace(traces, path=worker_audit_path(traces.path, worker.index))
            config = dataclasses.replace(config, telemetry=dataclasses.replace(config.telemetry, traces=traced))
        await worker.state.connect()
        hosted = worker.state if config.store.kind == "embedded" else None
    runtime = await build_runtime(config, hosted=hosted)
    try:
        await runtime.telemetry.start(worker)  # its listener's port taken stops start-up here
    except BaseException:
        await runtime.close()
        raise
    refusal = GatewayError(ErrorKind.UNAVAILABLE, "the gateway is shutting down; retry the request", code="shutting_down")
    app = CancelledByShutdown(create_app(runtime), generic_error_body(refusal))
    server = SignalFreeServer(
        uvicorn.Config(
            app,
            proxy_headers=False,  # X-Forwarded-For is caller-supplied: auth throttling must see the real peer
            host=config.host,
            port=config.port,
            loop="none",
            http=header_deadline_protocol(config.request_limits.header_timeout_seconds),  # httptools, with a header deadline
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=config.drain_seconds,
            ssl_certfile=config.tls_cert_file,
            ssl_keyfile=config.tls_key_file,
        )
    )

    stopped_by: list[str] = []

    def stop(signum: int) -> None:
        stopped_by.append(signal.Signals(signum).name)
        if server.should_exit:
            log.warning("%s again: cancelling requests in flight now", signal.Signals(signum).name)
            server.force_exit = True
            return
        log.info("%s: draining requests in flight (up to %.0f s), then shutting down", signal.Signals(signum).name, config.drain_seconds)
        server.should_exit = True

    def orphaned() -> None:  # nobody forwards signals or hosts the shared state any more
        log.warning("the supervisor is gone: this worker stops as on SIGTERM")
        stop(signal.SIGTERM)

    if worker is not None:
        worker.state.on_lost(orphaned)
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Future[bool]] = set()  # awaited before the runtime closes: a reload writes an audit record

    def reload_on_hangup() -> None:
        reload = asyncio.ensure_future(runtime.bundles.reload("SIGHUP"))
        reloads.add(reload)
        reload.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_on_hangup)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    watcher = asyncio.ensure_future(runtime.bundles.watch())
    upkeep = [asyncio.ensure_future(tend_audit(runtime.audit))]
    if runtime.capture is not None:
        upkeep.append(asyncio.ensure_future(purge_captures(runtime.capture)))
    if runtime.anchorer is not None:
        upkeep.append(asyncio.ensure_future(runtime.anchorer.run()))
    log.info(
        "%sserving on %s://%s:%d with bundle revision %r (%s), store %s",
        f"worker {worker.index}: " if worker is not None else "",
        "https" if config.tls_cert_file else "http",
        config.host,
        config.port,
        runtime.bundles.active.revision,
        runtime.bundles.active.digest[:12],
        config.store.kind,
    )
    try:
        serving = asyncio.ensure_future(server.serve(sockets=[worker.listener] if worker is not None else None))
        if (on_ready is not None or worker is not None) and await _when_listening(server, serving):
            try:
                if on_ready is not None:
                    await on_ready(runtime)  # listening now: what it prints can be pasted at once
            except BaseException:
                server.should_exit = True
                await serving
                raise
            if worker is not None:
                worker.state.notify(READY)
        await serving
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        if reloads:
            await asyncio.wait(reloads, timeout=FINALIZE_SECONDS)
        for background in (watcher, *upkeep):
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
        unfinished = {task for task in server.server_state.tasks if not task.done()}
        for task in unfinished:
            if not task.cancelling():  # a second signal ended the drain without cancelling them; a second cancel would cut their finalisation
                task.cancel()
        if unfinished:  # let them settle and record their outcome before the store closes
            await asyncio.wait(unfinished, timeout=FINALIZE_SECONDS)
        runtime.audit.append("gateway_stopped", signal=stopped_by[0] if stopped_by else None, cancelled_requests=app.cut)
        await runtime.close()
        if worker is not None:
            await worker.state.close()
        log.info("shut down cleanly")
