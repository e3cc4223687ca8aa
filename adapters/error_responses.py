"""Every refusal the gateway sends, whichever part refuses (the pipeline, a route of
the app, the HTTP edge, the shutdown drain): the body in the client's protocol, and
the same headers on all of them — the request id, Portcullis's own error code, and
``retry-after`` where waiting helps — so clients and operators read every refusal
one way."""

from __future__ import annotations

import json

from starlette.responses import Response

from portcullis.engine.errors import ErrorKind, GatewayError

ERROR_CODE_HEADER = "x-portcullis-error-code"
REQUEST_ID_HEADERS = ("x-portcullis-request-id", "request-id")


def error_headers(error: GatewayError, request_id: str | None) -> dict[str, str]:
    headers = {name: request_id for name in REQUEST_ID_HEADERS} if request_id else {}
    headers[ERROR_CODE_HEADER] = error.error_code
    if error.kind is ErrorKind.REQUEST_TIMEOUT:
        headers["connection"] = "close"  # the rest of a body that came too slowly is not read
    if error.retry_after is not None:
        headers["retry-after"] = str(error.retry_after)
    return headers


def error_response(body: bytes, error: GatewayError, request_id: str | None, headers: dict[str, str] | None = None, status: int | None = None) -> Response:
    """``body`` is the refusal as the client's protocol renders it (``wire.error_body``);
    ``status`` its own status where it differs from the kind's (``wire.error_status``)."""
    headers = {**error_headers(error, request_id), **(headers or {})}
    return Response(body, status or error.kind.status, headers=headers, media_type="application/json")


_GENERIC_TYPES = {ErrorKind.NOT_FOUND: "not_found_error", ErrorKind.INTERNAL: "api_error", ErrorKind.UNAVAILABLE: "api_error"}


def generic_error_body(error: GatewayError, request_id: str | None = None) -> bytes:
    """For a request whose protocol is unknown: readable by both SDK families
    (Anthropic's envelope around OpenAI's error object)."""
    kind = _GENERIC_TYPES.get(error.kind, "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": error.message, "code": error.error_code, "param": None}}).encode()
