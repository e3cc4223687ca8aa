"""The parts every wire format module shares: JSON and SSE framing, pacing a stream
through the scripted behaviour, echoing and splitting text into deltas."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from tests.fakes.behaviours import Behaviour, CutStream, Hang, Reply, StreamError


async def reply_for(behaviour: Behaviour) -> Reply:
    """Wait as the behaviour says, then the answer to send or stream."""
    if isinstance(behaviour, Hang):
        await asyncio.sleep(behaviour.seconds)
    reply = behaviour if isinstance(behaviour, Reply) else Reply()
    if reply.delay:
        await asyncio.sleep(reply.delay)
    return reply


def model_of(body: bytes) -> str | None:
    try:
        return json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None


def json_response(document: Any, headers: dict[str, str]) -> Response:
    return Response(json.dumps(document), 200, headers=headers, media_type="application/json")


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def paced(events: list[bytes], delay: float, behaviour: Behaviour, error_event: Callable[[str], bytes]) -> AsyncIterator[bytes]:
    for i, event in enumerate(events):
        if isinstance(behaviour, CutStream) and i == behaviour.after:
            raise ConnectionResetError("fake provider cut the stream")  # uvicorn drops the connection
        if isinstance(behaviour, StreamError) and i == behaviour.after:
            yield error_event(behaviour.error_type)
            return
        if delay:
            await asyncio.sleep(delay)
        yield event


def echoed(reply: Reply, payload: dict[str, Any]) -> Reply:
    if not reply.echo:
        return reply
    said = ""
    for message in payload.get("messages") or []:
        if message.get("role") == "user":
            content = message.get("content")
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            said = " ".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return dataclasses.replace(reply, text=said)


def split(text: str, parts: int = 3) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]
