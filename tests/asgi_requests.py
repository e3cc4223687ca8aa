"""A Starlette ``Request`` as uvicorn hands one to the gateway, built in memory: the
scope given and the body delivered in one message, then a disconnect. For the unit
suites that call the gateway's handlers without a server."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request


def arrived_request(scope: dict[str, Any], body: bytes) -> Request:
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)
