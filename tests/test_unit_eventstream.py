"""The AWS event-stream codec the gateway reads Bedrock streams with and writes them to
Bedrock clients: what it encodes, botocore's own decoder reads back; what is corrupt,
oversized or cut short is refused; InvokeModel chunks are unwrapped to their Anthropic
event and wrapped again; frames read off a stream go on byte for byte."""

from __future__ import annotations

import base64
import binascii
import json
import struct

import pytest
from botocore.eventstream import EventStreamBuffer

from portcullis.adapters.protocols.eventstream import (
    CONVERSE_FRAMING,
    INVOKE_FRAMING,
    MAX_FRAME_BYTES,
    EventStreamError,
    FramedEvent,
    FrameParser,
    encode_frame,
    event_frame,
    exception_frame,
)
from portcullis.adapters.protocols.sse import SSEEvent
from tests.fakes import Reply, ToolCall
from tests.fakes.bedrock_runtime import chunk_frame, converse_frames


def botocore_decoded(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    codec = EventStreamBuffer()
    codec.add_data(data)
    return [(dict(message.headers), bytes(message.payload)) for message in codec]


def test_frames_encoded_here_are_what_botocore_decodes() -> None:
    headers = {":event-type": "contentBlockDelta", ":content-type": "application/json", ":message-type": "event", "x-note": "ünïcode"}
    payload = json.dumps({"delta": {"text": "héllo ✓"}, "contentBlockIndex": 0}, ensure_ascii=False).encode()
    frames = encode_frame(headers, payload) + event_frame("messageStop", {"stopReason": "end_turn"}) + exception_frame("throttlingException", "slow down")
    decoded = botocore_decoded(frames)
    assert decoded[0] == (headers, payload)
    assert decoded[1] == ({":event-type": "messageStop", ":content-type": "application/json", ":message-type": "event"}, b'{"stopReason":"end_turn"}')
    assert decoded[2][0] == {":exception-type": "throttlingException", ":content-type": "application/json", ":message-type": "exception"}
    assert json.loads(decoded[2][1]) == {"message": "slow down"}


def test_the_parser_reads_frames_however_the_bytes_are_split() -> None:
    stream = b"".join(converse_frames(Reply(text="one two three", tool_calls=(ToolCall("shell", {"cmd": "ls"}, id="tu_1"),)), "tool_use", 5))
    parser = CONVERSE_FRAMING.Parser()
    events = [event for i in range(len(stream)) for event in parser.feed(stream[i : i + 1])] + parser.close()
    names = [event.event for event in events]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    start = next(event.json() for event in events if event.event == "contentBlockStart")
    assert start["contentBlockStart"]["start"]["toolUse"] == {"toolUseId": "tu_1", "name": "shell"}
    text = "".join(event.json()["contentBlockDelta"]["delta"].get("text", "") for event in events if event.event == "contentBlockDelta")
    assert text == "one two three"
    assert events[-1].json()["metadata"]["usage"] == {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120}


def test_a_corrupted_prelude_crc_is_refused() -> None:
    frame = bytearray(event_frame("messageStart", {"role": "assistant"}))
    frame[9] ^= 0xFF  # inside the prelude's CRC
    with pytest.raises(EventStreamError, match="prelude"):
        FrameParser().feed(bytes(frame))


def test_a_corrupted_message_crc_is_refused() -> None:
    frame = bytearray(event_frame("contentBlockDelta", {"delta": {"text": "hello"}, "contentBlockIndex": 0}))
    frame[-8] ^= 0x01  # a payload byte: the message CRC no longer matches
    with pytest.raises(EventStreamError, match="malformed"):
        FrameParser().feed(bytes(frame))


def test_a_length_over_the_cap_is_refused_from_the_prelude_alone() -> None:
    head = struct.pack("!II", MAX_FRAME_BYTES + 1, 0)
    prelude = head + struct.pack("!I", binascii.crc32(head))  # a valid prelude announcing too much
    parser = FrameParser()
    with pytest.raises(EventStreamError, match="length"):
        parser.feed(prelude)  # nothing after the 12 bytes: refused before the frame is buffered


def test_a_stream_cut_inside_a_frame_is_refused_at_close() -> None:
    frame = event_frame("messageStop", {"stopReason": "end_turn"})
    parser = FrameParser()
    assert parser.feed(frame + frame[:10]) != [] and parser.feed(frame[10:20]) == []
    with pytest.raises(EventStreamError, match="inside a frame"):
        parser.close()


def test_invoke_chunks_are_unwrapped_to_their_anthropic_event() -> None:
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
    (parsed,) = INVOKE_FRAMING.Parser().feed(chunk_frame(event, 3))
    assert parsed.event == "content_block_delta" and json.loads(parsed.data) == event
    assert isinstance(parsed, FramedEvent) and not parsed.exception


def test_an_event_the_gateway_changed_is_framed_again_as_a_chunk() -> None:
    document = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "[withheld]"}}
    changed = SSEEvent("content_block_delta", json.dumps(document), b"")
    ((headers, payload),) = botocore_decoded(INVOKE_FRAMING.frame(changed))
    assert headers[":event-type"] == "chunk" and headers[":message-type"] == "event"
    assert base64.b64decode(json.loads(payload)["bytes"]).decode() == changed.data


def test_a_chunk_without_base64_json_is_refused() -> None:
    with pytest.raises(EventStreamError, match="chunk"):
        INVOKE_FRAMING.Parser().feed(event_frame("chunk", {"bytes": "not base64!"}))


def test_exception_frames_become_exception_events_both_ways() -> None:
    for framing in (CONVERSE_FRAMING, INVOKE_FRAMING):
        (event,) = framing.Parser().feed(exception_frame("modelStreamErrorException", "the model failed"))
        assert isinstance(event, FramedEvent) and event.exception
        assert event.event == "modelStreamErrorException" and event.json() == {"modelStreamErrorException": {"message": "the model failed"}}
        made = FramedEvent("throttlingException", json.dumps({"throttlingException": {"message": "slow down"}}), b"", exception=True)
        ((headers, payload),) = botocore_decoded(framing.frame(made))
        assert headers[":message-type"] == "exception" and headers[":exception-type"] == "throttlingException"
        assert json.loads(payload) == {"message": "slow down"}


def test_frames_read_off_a_stream_are_forwarded_byte_for_byte() -> None:
    for framing, frames in (
        (CONVERSE_FRAMING, converse_frames(Reply(text="padded and forwarded"), "end_turn", 9)),
        (INVOKE_FRAMING, [chunk_frame({"type": "message_stop"}, 7), exception_frame("internalServerException", "x")]),
    ):
        stream = b"".join(frames)
        parser = framing.Parser()
        events = parser.feed(stream[:37]) + parser.feed(stream[37:]) + parser.close()
        assert [framing.frame(event) for event in events] == frames
        assert all(isinstance(event, FramedEvent) and event.raw for event in events)


def test_a_frame_without_an_event_type_or_with_a_non_utf8_payload_is_refused() -> None:
    with pytest.raises(EventStreamError, match="event type"):
        CONVERSE_FRAMING.Parser().feed(encode_frame({":message-type": "event"}, b"{}"))
    with pytest.raises(EventStreamError, match="UTF-8"):
        CONVERSE_FRAMING.Parser().feed(encode_frame({":event-type": "messageStart", ":message-type": "event"}, b"\xff\xfe"))
