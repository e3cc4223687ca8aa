"""The mock provider's Anthropic Messages answers: text, or a `tool_use` block."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.sse import encode
from portcullis.adapters.providers.mock.answer import MockResponse, json_response, stream_response
from portcullis.adapters.providers.mock.shell_call import ShellCall


def answer(request: Mapping[str, Any], words: list[str], input_tokens: int, call: ShellCall | None) -> MockResponse:
    output_tokens = len(words) if call is None else len(call.pieces())
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message = {"id": f"msg_mock_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant", "model": request.get("model"), "stop_sequence": None}
    stop_reason = "end_turn" if call is None else "tool_use"
    if call is None:
        block: dict[str, Any] = {"type": "text", "text": "".join(words)}
        deltas = [{"type": "text_delta", "text": w} for w in words]
    else:
        block = {"type": "tool_use", "id": f"toolu_mock{uuid.uuid4().hex[:20]}", "name": call.name, "input": json.loads(call.arguments)}
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in call.pieces()]
    if not request.get("stream"):
        return json_response({**message, "content": [block], "stop_reason": stop_reason, "usage": usage})
    opening = {**block, "text": ""} if call is None else {**block, "input": {}}
    ending = {"stop_reason": stop_reason, "stop_sequence": None}
    events = [
        encode({"type": "message_start", "message": {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}}, "message_start"),
        encode({"type": "content_block_start", "index": 0, "content_block": opening}, "content_block_start"),
        *(encode({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta") for delta in deltas),
        encode({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        encode({"type": "message_delta", "delta": ending, "usage": {"output_tokens": output_tokens}}, "message_delta"),
        encode({"type": "message_stop"}, "message_stop"),
    ]
    return stream_response(events)
