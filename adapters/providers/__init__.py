"""Upstream model providers. ``anthropic`` and ``openai`` (any OpenAI-compatible
server, vLLM included) are reached over HTTP with aiohttp, ``bedrock`` too, signed with
AWS credentials (``bedrock.py``); ``mock`` answers in-process for offline quickstarts. The gateway attaches a provider's credential only when it
dispatches (from its key pool, ``keys.py``), and never forwards the client's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from portcullis.adapters.config import ProviderConfig
from portcullis.adapters.protocols.anthropic_messages import wire as messages_wire
from portcullis.adapters.protocols.openai_chat import wire as chat_wire
from portcullis.adapters.protocols.openai_responses import wire as responses_wire
from portcullis.engine.endpoint_policy import DEFAULT_POLICY, EndpointPolicy


class UpstreamUnreachable(Exception):
    """No response could be had: connection refused or reset, or a timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "connect" | "timeout" | "connection_lost"


class UpstreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    async def read(self, limit: int) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...
    def release(self) -> None: ...


class Provider(Protocol):
    name: str

    def protocol_for(self, model: str, client: str | None) -> str | None:
        """The protocol a call to ``model`` speaks, for a client speaking ``client``
        (None: the client's, whichever it is: the mock)."""
        ...

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> UpstreamResponse:
        """``affinity``: the conversation's key, for a provider with several endpoints to
        send it to the same one each turn (None: no conversation to keep together)."""
        ...

    async def close(self) -> None: ...


# A ``bedrock`` provider picks per model and client (``BedrockProvider.protocol_for``:
# InvokeModel for Anthropic models asked in Messages); Converse is what every model speaks.
PROTOCOL_OF_TYPE = {"anthropic": messages_wire.NAME, "openai": chat_wire.NAME, "bedrock": "bedrock_converse", "mock": None}
# An ``openai`` provider speaks Chat Completions unless configured with ``wire: responses``.
PROTOCOL_OF_OPENAI_WIRE = {"chat": chat_wire.NAME, "responses": responses_wire.NAME}


def protocol_of(config: ProviderConfig) -> str | None:
    """The protocol a configured provider speaks (None: whichever the client does)."""
    if config.type == "openai":
        return PROTOCOL_OF_OPENAI_WIRE[config.wire]
    return PROTOCOL_OF_TYPE[config.type]


def build_provider(config: ProviderConfig, endpoint_policy: Callable[[], EndpointPolicy] = lambda: DEFAULT_POLICY) -> Provider:
    """``endpoint_policy``: the active bundle's, for a provider with several endpoints."""
    if config.type == "mock":
        from portcullis.adapters.providers.mock import MockProvider

        return MockProvider(config.name)
    if config.type == "bedrock":
        from portcullis.adapters.providers.bedrock import BedrockProvider

        return BedrockProvider(config)
    from portcullis.adapters.providers.http import HttpProvider

    return HttpProvider(config, protocol_of(config), endpoint_policy)
