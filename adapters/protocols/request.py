"""A client request as every protocol's parser hands it on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from portcullis.adapters.config import RequestLimits

DEFAULT_LIMITS = RequestLimits()
NO_PATH: Mapping[str, str] = MappingProxyType({})  # a route without path parameters


@dataclass
class ParsedRequest:
    """A client request after ingress validation: the body as sent (``raw``, the
    fast-path candidate) and as parsed, plus what the policy needs to know."""

    protocol: str
    raw: bytes
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    requires: list[str]
    forward_headers: dict[str, str] = field(default_factory=dict)
    query: str = ""
    choices: int = 1  # completions the request asks for (OpenAI `n`): each can use max_tokens
    session: str | None = None  # the client's conversation id, when it sends one
    client: str = "other"  # which client sent it (engine/clients.py), from its User-Agent
    tools: list[str] = field(default_factory=list)  # names of the tools the request offers the model
    reasoning_tokens: int | None = None  # a declared reasoning budget (thinking.budget_tokens), within max_tokens
    reasoning_effort: str | None = None  # a named reasoning effort (reasoning_effort, reasoning.effort): no token number
    hop: str | None = None  # a previous gateway's signed policy-prompt header, unverified
