"""Anthropic's token count (``POST /v1/messages/count_tokens``): a Messages body
without ``max_tokens``; the answer is ``{"input_tokens": N}``."""

from __future__ import annotations

import json
from collections.abc import Mapping

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.anthropic_messages.wire import parse_messages
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest

PATH = "/v1/messages/count_tokens"


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    return parse_messages(raw, headers, query, limits, counting=True)


def estimate_body(tokens: int) -> bytes:
    return json.dumps({"input_tokens": tokens}).encode()
