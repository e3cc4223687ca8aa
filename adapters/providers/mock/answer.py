"""What the mock provider sends back: a status, a content type and the body in parts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any


class MockResponse:
    def __init__(self, status: int, content_type: str, parts: list[bytes]) -> None:
        self.status = status
        self.headers: Mapping[str, str] = {"content-type": content_type}
        self._parts = parts

    async def read(self, limit: int) -> bytes:
        return b"".join(self._parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part

    def release(self) -> None:
        return None


def json_response(body: Mapping[str, Any]) -> MockResponse:
    return MockResponse(200, "application/json", [json.dumps(body).encode()])


def stream_response(events: list[bytes]) -> MockResponse:
    return MockResponse(200, "text/event-stream", events)
