"""Server-sent events: an incremental parser that keeps each event's exact bytes (so
a same-protocol stream is forwarded untouched) and an encoder for events the
gateway writes itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.json_bytes import compact

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE_END = re.compile(r"\r\n|\r|\n")  # not str.splitlines(): U+2028 and U+0085 are legal inside JSON strings
MAX_EVENT_BYTES = 8 * 1024 * 1024


CONTENT_TYPE = "text/event-stream; charset=utf-8"


class SSEError(ValueError):
    """The upstream stream is not well-formed (SSE, or another framing's subclass)."""


@dataclass(frozen=True)
class SSEEvent:
    """One event of a stream, whatever its framing: its name, its data (JSON text) and
    its bytes as received (empty when the gateway made it)."""

    event: str | None
    data: str
    raw: bytes  # exactly as received, terminating blank line included

    def json(self) -> Any:
        return json.loads(self.data)


class SSEParser:
    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events = []
        start = 0
        for match in _BOUNDARY.finditer(self._buffer):
            block = self._buffer[start : match.end()]
            start = match.end()
            event = _parse(block)
            if event is not None:
                events.append(event)
        self._buffer = self._buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise SSEError("an upstream event exceeds the size limit")
        return events

    def close(self) -> list[SSEEvent]:
        """A final event the upstream did not terminate with a blank line."""
        block, self._buffer = self._buffer, b""
        event = _parse(block + b"\n\n") if block.strip() else None
        return [event] if event is not None else []


def _parse(block: bytes) -> SSEEvent | None:
    name: str | None = None
    data: list[str] = []
    for line in _LINE_END.split(block.decode("utf-8", errors="replace")):
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if name is None and not data:
        return None  # a comment or keep-alive
    return SSEEvent(name, "\n".join(data), block)


def encode(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else _dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def event_of(document: Any, event: str | None = None) -> SSEEvent:
    """An event carrying ``document``, as the gateway writes one."""
    data = _dumps(document)
    return SSEEvent(event, data, encode(data, event))


def _dumps(document: Any) -> str:
    try:
        return compact(document).decode()  # json.dumps's bytes, faster (json_bytes.py)
    except UnicodeEncodeError:  # a lone surrogate a provider sent escaped: it goes back escaped, as valid JSON
        return json.dumps(document, separators=(",", ":"))


class SSEFraming:
    """The ``Framing`` of server-sent events: an event goes out as its own bytes."""

    CONTENT_TYPE = CONTENT_TYPE
    Parser = SSEParser

    @staticmethod
    def frame(event: SSEEvent) -> bytes:
        return event.raw if event.raw else encode(event.data, event.event)


SSE_FRAMING = SSEFraming()
