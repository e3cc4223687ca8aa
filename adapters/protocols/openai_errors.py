"""OpenAI's error envelope, shared by the Chat Completions and Responses wires:
``{"error": {"message", "type", "param", "code"}}``, with OpenAI's own ``code`` where it
has one (``invalid_api_key``, ``model_not_found``, ``rate_limit_exceeded``, …) so SDK
users' checks work, Portcullis's otherwise."""

from __future__ import annotations

from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError

ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: ("invalid_request_error", None),
    ErrorKind.AUTHENTICATION: ("authentication_error", "invalid_api_key"),
    ErrorKind.PAYMENT_REQUIRED: ("insufficient_quota", None),
    ErrorKind.PERMISSION: ("permission_error", None),
    ErrorKind.NOT_FOUND: ("invalid_request_error", "model_not_found"),
    ErrorKind.METHOD_NOT_ALLOWED: ("invalid_request_error", None),
    ErrorKind.UPGRADE_REQUIRED: ("invalid_request_error", None),
    ErrorKind.REQUEST_TIMEOUT: ("invalid_request_error", "timeout"),
    ErrorKind.REQUEST_TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.HEADERS_TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.RATE_LIMITED: ("rate_limit_error", "rate_limit_exceeded"),
    ErrorKind.INTERNAL: ("server_error", None),
    ErrorKind.UPSTREAM: ("server_error", None),
    ErrorKind.UNAVAILABLE: ("server_error", None),
    ErrorKind.TIMEOUT: ("server_error", "timeout"),
}


def error_object(error: GatewayError) -> dict[str, Any]:
    kind, native_code = ERROR_TYPES[error.kind]
    return {"message": error.message, "type": kind, "param": None, "code": native_code or error.error_code}
