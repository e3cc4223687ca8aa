"""What the gateway takes from an HTTP request: the body within its bounds, parsed in
the client's protocol, the request id, the client's address and conversation id."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping

from starlette.requests import ClientDisconnect, Request

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.offload import off_loop, parse_apart
from portcullis.adapters.operations import Operation
from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.errors import ErrorKind, GatewayError


async def read_body(http: Request, limit: int, seconds: float | None = None) -> bytes:
    """Refuse a body over ``limit`` without buffering all of it, and one that takes
    longer than ``seconds`` to arrive (a slow drip holds a connection and a buffer for
    as long as the client likes)."""
    declared = http.headers.get("content-length", "")
    too_large = GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(seconds):
            async for chunk in http.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except ClientDisconnect:
        raise GatewayError(ErrorKind.INVALID_REQUEST, "the client disconnected while sending the request", code="client_disconnected") from None
    except TimeoutError:
        raise GatewayError(ErrorKind.REQUEST_TIMEOUT, f"the request body did not arrive within {seconds:g} seconds", code="body_timeout") from None
    return await off_loop(size, b"".join, chunks)


SESSION_HEADERS = ("x-portcullis-session-id", "x-claude-code-session-id")


def session_of(headers: Mapping[str, str]) -> str | None:
    """The client's conversation id: scopes pseudonyms so they stay stable across turns.
    It only ever narrows what a principal reaches (scopes include the principal)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and len(value) <= 256 and value.isprintable():
            return value
    return None


def client_address(http: Request) -> str:
    return http.client.host if http.client else "unknown"


def request_id_of(http: Request) -> str:
    """The id the request-id middleware gave this request (one id per request, in every
    header, log line and audit record), or a new one outside it."""
    state = http.scope.get("state")
    given = state.get("request_id") if isinstance(state, dict) else None
    return given if isinstance(given, str) else new_request_id()


def new_request_id() -> str:
    # Time-ordered, so audit records sort by arrival; random tail for uniqueness (48 bits
    # straight from os.urandom, as uuid4 drew them, without building a UUID).
    return f"req_{time.time_ns():x}{os.urandom(6).hex()}"


async def parse_request(
    protocol: WireProtocol, raw: bytes, http: Request, limits: RequestLimits, operation: Operation = Operation.INFERENCE
) -> ParsedRequest:
    """A large body is parsed and validated on a worker thread: the walk is pure
    Python, and the event loop must keep serving every other client meanwhile."""
    query = http.scope["query_string"].decode("latin-1")
    parse = protocol.parser(operation)
    if len(raw) <= limits.offload_bytes:
        return parse(raw, http.headers, query, limits, http.path_params)
    parsed, refusal = await off_loop(len(raw), parse_apart, protocol, raw, http.headers, query, limits, http.path_params, parse)
    if refusal is not None:
        raise refusal
    assert parsed is not None
    return parsed
