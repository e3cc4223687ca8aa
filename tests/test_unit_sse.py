from __future__ import annotations

from portcullis.adapters.protocols.sse import SSEParser, encode


def test_events_split_across_chunks_keep_their_exact_bytes() -> None:
    stream = b'event: a\ndata: {"x": 1}\n\n: keep-alive\n\nevent: b\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n'
    parser = SSEParser()
    events = []
    for i in range(0, len(stream), 7):
        events += parser.feed(stream[i : i + 7])
    events += parser.close()
    assert [(e.event, e.data) for e in events] == [("a", '{"x": 1}'), ("b", "line1\nline2"), (None, "[DONE]")]
    assert events[0].raw == b'event: a\ndata: {"x": 1}\n\n'


def test_crlf_and_unterminated_final_event() -> None:
    parser = SSEParser()
    events = parser.feed(b"event: a\r\ndata: 1\r\n\r\ndata: 2")
    assert [(e.event, e.data) for e in events] == [("a", "1")]
    assert [e.data for e in parser.close()] == ["2"]


def test_encode() -> None:
    assert encode({"a": 1}, "x") == b'event: x\ndata: {"a":1}\n\n'
    assert encode("[DONE]") == b"data: [DONE]\n\n"
