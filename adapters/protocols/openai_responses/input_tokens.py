"""OpenAI's input token count (``POST /v1/responses/input_tokens``): a Responses body
(model, input, instructions, tools, …) whose answer is the input's size,
``{"object": "response.input_tokens", "input_tokens": N}``."""

from __future__ import annotations

import json
from collections.abc import Mapping

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.openai_responses.wire import parse as parse_response_request
from portcullis.adapters.protocols.request import DEFAULT_LIMITS, NO_PATH, ParsedRequest

PATH = "/responses/input_tokens"  # appended to a base_url that ends in /v1, as for /responses


def parse(raw: bytes, headers: Mapping[str, str], query: str = "", limits: RequestLimits = DEFAULT_LIMITS, path: Mapping[str, str] = NO_PATH) -> ParsedRequest:
    """Read as a Responses request: the same fields, the same checks, the same surfaces."""
    return parse_response_request(raw, headers, query, limits)


def estimate_body(tokens: int) -> bytes:
    return json.dumps({"object": "response.input_tokens", "input_tokens": tokens}).encode()
