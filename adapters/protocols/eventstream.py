"""The AWS event stream (``application/vnd.amazon.eventstream``): Bedrock Runtime's
streaming framing, as both its clients and the gateway's Bedrock provider speak it.

A frame is a prelude (total length, headers length, CRC32 of both), string headers
(``:message-type`` event or exception, ``:event-type`` or ``:exception-type``,
``:content-type``), a payload and a CRC32 of everything before it. Frames are decoded
with botocore's codec, which checks both CRCs; the length in the prelude is checked
against ``MAX_FRAME_BYTES`` before anything more of the frame is buffered, so a
provider cannot make the gateway allocate what it announces.

Decoded, a frame becomes the same ``SSEEvent`` every guard and meter reads (a name and
a JSON document), keeping its exact bytes so a same-protocol stream is forwarded
untouched. An event the gateway changed or wrote itself has no such bytes and is
framed again. Two framings exist:

- Converse streams carry one event per frame; its document is the payload under the
  event's type (``{"contentBlockDelta": {...}}``), as the AWS SDKs present it, so a
  document says what it is wherever it goes (exceptions alike:
  ``{"throttlingException": {"message": ...}}``).
- InvokeModel streams wrap each Anthropic Messages event in a ``chunk`` frame
  (``{"bytes": base64(event JSON)}``), which is unwrapped: the event is read as the
  Messages protocol reads it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.eventstream import EventStreamBuffer, ParserError

from portcullis.adapters.protocols.sse import SSEError, SSEEvent

CONTENT_TYPE = "application/vnd.amazon.eventstream"
MAX_FRAME_BYTES = 16 * 1024 * 1024
_PRELUDE = struct.Struct("!III")  # total length, headers length, prelude CRC32
_HEADER_STRING = 7  # the header value type for a UTF-8 string


class EventStreamError(SSEError):
    """The provider's event stream is not well-formed (a CRC, a length, a header)."""


@dataclass(frozen=True)
class FramedEvent(SSEEvent):
    """An event decoded off an event stream; ``raw`` is its frame, exactly as received.
    ``exception``: a ``:message-type: exception`` frame (``event`` is its type)."""

    exception: bool = False


# --- encoding ---------------------------------------------------------------------------------


def encode_frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One frame with string headers, both CRCs computed."""
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    total = _PRELUDE.size + len(encoded) + len(payload) + 4
    head = struct.pack("!II", total, len(encoded))
    prelude = head + struct.pack("!I", binascii.crc32(head))
    body = prelude + encoded + payload
    return body + struct.pack("!I", binascii.crc32(body))


def _header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    return struct.pack("!B", len(key)) + key + struct.pack("!BH", _HEADER_STRING, len(text)) + text


def event_frame(event_type: str, payload: Any) -> bytes:
    """An event frame carrying ``payload`` (a document, or JSON text) as JSON."""
    data = payload if isinstance(payload, str) else _dumps(payload)
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return encode_frame(headers, data.encode())


def exception_frame(exception_type: str, message: str) -> bytes:
    """An exception frame, as Bedrock ends a stream that failed: boto3 raises it as
    ``EventStreamError`` with this type and message."""
    headers = {":exception-type": exception_type, ":content-type": "application/json", ":message-type": "exception"}
    return encode_frame(headers, _dumps({"message": message}).encode())


def _dumps(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


# --- decoding ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    headers: dict[str, Any]
    payload: bytes
    raw: bytes


class FrameParser:
    """Bytes in, complete frames out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[Frame]:
        self._buffer += chunk
        frames = []
        while len(self._buffer) >= _PRELUDE.size:
            total, _, crc = _PRELUDE.unpack_from(self._buffer)
            if binascii.crc32(self._buffer[:8]) != crc:
                raise EventStreamError("an event-stream prelude failed its CRC check")
            if not _PRELUDE.size + 4 <= total <= MAX_FRAME_BYTES:
                raise EventStreamError("an event-stream frame announces a length outside the limit")
            if len(self._buffer) < total:
                break
            raw = bytes(self._buffer[:total])
            del self._buffer[:total]
            frames.append(_decoded(raw))
        return frames

    def close(self) -> list[Frame]:
        if self._buffer:
            self._buffer.clear()
            raise EventStreamError("the event stream ended inside a frame")
        return []


def _decoded(raw: bytes) -> Frame:
    codec = EventStreamBuffer()
    codec.add_data(raw)
    try:
        message = next(codec)
    except (ParserError, StopIteration, struct.error, UnicodeDecodeError) as error:
        raise EventStreamError(f"an event-stream frame is malformed ({type(error).__name__})") from None
    return Frame(dict(message.headers), bytes(message.payload), raw)


class _EventParser:
    """Frames as events; ``unwrap_chunks``: InvokeModel's ``chunk`` frames carry a
    base64 Messages event, which becomes the event."""

    def __init__(self, unwrap_chunks: bool) -> None:
        self._frames = FrameParser()
        self._unwrap = unwrap_chunks

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return [self._event(frame) for frame in self._frames.feed(chunk)]

    def close(self) -> list[SSEEvent]:
        return [self._event(frame) for frame in self._frames.close()]

    def _event(self, frame: Frame) -> SSEEvent:
        kind = frame.headers.get(":message-type", "event")
        try:
            data = frame.payload.decode("utf-8")
        except UnicodeDecodeError:
            raise EventStreamError("an event-stream payload is not UTF-8") from None
        exception = kind != "event"
        if exception:
            name = str(frame.headers.get(":exception-type") or frame.headers.get(":error-code") or "internalServerException")
        else:
            name = str(frame.headers.get(":event-type", ""))
        if not _NAME.fullmatch(name):
            raise EventStreamError("an event-stream frame has no usable event type")
        if exception or not self._unwrap:
            try:  # parsed, not pasted in: a payload must be one JSON object, whatever its bytes say
                payload = json.loads(data) if data else {}
            except ValueError:
                raise EventStreamError("an event-stream payload is not JSON") from None
            if not isinstance(payload, dict):
                raise EventStreamError("an event-stream payload is not a JSON object")
            message = frame.headers.get(":error-message")
            if exception and isinstance(message, str) and "message" not in payload:
                payload["message"] = message  # an error frame says it in a header
            return FramedEvent(name, _dumps({name: payload}), frame.raw, exception=exception)
        if name == "chunk":
            try:
                inner = base64.b64decode(json.loads(data)["bytes"], validate=True).decode("utf-8")
                kind_of = json.loads(inner).get("type")
            except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
                raise EventStreamError("an InvokeModel chunk does not carry a base64 JSON event") from None
            return FramedEvent(kind_of if isinstance(kind_of, str) else None, inner, frame.raw)
        return FramedEvent(name, data, frame.raw)


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class EventStreamFraming:
    """The ``Framing`` of a Bedrock stream: how its bytes become events and back."""

    CONTENT_TYPE = CONTENT_TYPE

    def __init__(self, unwrap_chunks: bool) -> None:
        self._unwrap = unwrap_chunks

    def Parser(self) -> _EventParser:
        return _EventParser(self._unwrap)

    def frame(self, event: SSEEvent) -> bytes:
        """An event's bytes on this framing: as received when it came off one, else
        framed anew (an exception event as an exception frame)."""
        if isinstance(event, FramedEvent) and event.raw:
            return event.raw
        if self._unwrap and not (isinstance(event, FramedEvent) and event.exception):
            return event_frame("chunk", {"bytes": base64.b64encode(event.data.encode()).decode()})
        ((name, payload),) = json.loads(event.data).items()  # one member: the type, as the parser wrote it
        if isinstance(event, FramedEvent) and event.exception:
            message = payload.get("message") if isinstance(payload, dict) else None
            return exception_frame(name, message if isinstance(message, str) else "the stream failed")
        return event_frame(name, payload)


CONVERSE_FRAMING = EventStreamFraming(unwrap_chunks=False)
INVOKE_FRAMING = EventStreamFraming(unwrap_chunks=True)
