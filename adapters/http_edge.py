"""What every HTTP response passes through, whatever route served it: one request id
per request (``request-id`` / ``x-portcullis-request-id``), and answers for paths
and methods the gateway does not serve, in the shape of the protocol the path
belongs to, so a client's SDK reads them and an operator sees who is failing."""

from __future__ import annotations

import json
import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from portcullis.adapters.error_responses import error_response, generic_error_body
from portcullis.adapters.ingress import new_request_id
from portcullis.adapters.protocols import anthropic_messages, aws_errors, openai_chat
from portcullis.engine.errors import ErrorKind, GatewayError, excerpt

log = logging.getLogger("portcullis.http")

REQUEST_ID_HEADERS = (b"request-id", b"x-portcullis-request-id")
BEDROCK_PREFIX = "/model/"  # Bedrock Runtime's paths
AWS_REQUEST_ID_HEADER = b"x-amzn-requestid"  # boto3 reports it as ResponseMetadata.RequestId


class RequestIds:
    """ASGI middleware: gives each request its id before any route runs (the gateway
    reuses it) and adds the id headers to any response that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_for(scope)
        names = (*REQUEST_ID_HEADERS, AWS_REQUEST_ID_HEADER) if scope["path"].startswith(BEDROCK_PREFIX) else REQUEST_ID_HEADERS

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", ())}
                missing = [(name, request_id.encode()) for name in names if name not in present]
                if missing:
                    message = {**message, "headers": [*message.get("headers", ()), *missing]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_for(scope: Scope) -> str:
    state = scope.setdefault("state", {})
    if not isinstance(state.get("request_id"), str):
        state["request_id"] = new_request_id()
    return state["request_id"]


# --- unknown routes and methods --------------------------------------------------------



def family_of(request: Request) -> str:
    """The protocol a path belongs to: Bedrock Runtime (``/model/...``), Anthropic (its
    paths, or any request that carries ``anthropic-version``), OpenAI (the rest of /v1)."""
    path = request.url.path
    if path.startswith(BEDROCK_PREFIX):
        return "aws"
    if path.startswith("/v1/messages") or path.startswith("/v1/complete") or "anthropic-version" in request.headers:
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "generic"


def route_error(request: Request, status: int, allowed: str | None = None) -> Response:
    """A 404 or 405 in the shape of the path's protocol, logged with its request id. A
    WebSocket upgrade gets 426 wherever it asks: clients that try WebSocket first (Codex on
    /v1/responses) fall back to HTTPS at once on 426, but retry a 404 or 405 for seconds."""
    request_id = request_id_for(request.scope)
    family = family_of(request)
    path = excerpt(request.url.path)
    if request.headers.get("upgrade", "").lower() == "websocket":
        log.info("%s WebSocket upgrade refused family=%s path=%s", request_id, family, path)
        message = f"{path} is served over HTTPS POST only: this gateway does not speak WebSocket"
        error = GatewayError(ErrorKind.UPGRADE_REQUIRED, message, code="websocket_unsupported")
        return protocol_error(family, error, request_id)
    kind = ErrorKind.NOT_FOUND if status == 404 else ErrorKind.METHOD_NOT_ALLOWED
    method = request.method if request.method.isalpha() and len(request.method) <= 16 else excerpt(request.method)  # the parser admits only tokens
    message = f"this gateway does not serve {method} {path}" if status == 404 else f"{path} does not accept {method}"
    code = "unknown_route" if status == 404 else "method_not_allowed"
    log.info("%s unknown route family=%s method=%s path=%s status=%d", request_id, family, method, path, status)
    return protocol_error(family, GatewayError(kind, message, code=code), request_id, {"allow": allowed} if allowed else None)


def protocol_error(family: str, error: GatewayError, request_id: str, headers: dict[str, str] | None = None) -> Response:
    """A refusal for a request no route of the gateway took, in its path's protocol."""
    headers, status = dict(headers or {}), None
    if family == "anthropic":
        body = anthropic_messages.PROTOCOL.wire.error_body(error, request_id)
    elif family == "aws":
        headers.update(aws_errors.error_headers(error, request_id))
        body, status = aws_errors.error_body(error, request_id), aws_errors.error_status(error)
    elif family == "openai" and error.kind in (ErrorKind.NOT_FOUND, ErrorKind.METHOD_NOT_ALLOWED, ErrorKind.UPGRADE_REQUIRED):
        # Not a model: OpenAI's own code for these is none, so Portcullis's stands.
        body = json.dumps({"error": {"message": error.message, "type": "invalid_request_error", "param": None, "code": error.error_code}}).encode()
    elif family == "openai":
        body = openai_chat.PROTOCOL.wire.error_body(error, request_id)
    else:
        body = generic_error_body(error, request_id)
    return error_response(body, error, request_id, headers, status)
