"""Which code path serves a (client protocol, provider protocol) pair.

Same protocol and untouched: the client's bytes go upstream (only the model name
swapped) and the provider's bytes come back. Different protocols: the pair's
translator converts the request, the response and the stream."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from portcullis.adapters.protocols import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    ParsedRequest,
    anthropic_messages,
    anthropic_messages_openai_chat,
    invalid,
    openai_chat,
    openai_chat_anthropic_messages,
)
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.engine.plan import Target

log = logging.getLogger("portcullis.protocols")

PROTOCOLS: dict[str, ModuleType] = {ANTHROPIC_MESSAGES: anthropic_messages, OPENAI_CHAT: openai_chat}
TRANSLATORS: dict[tuple[str, str], ModuleType] = {
    (OPENAI_CHAT, ANTHROPIC_MESSAGES): openai_chat_anthropic_messages,
    (ANTHROPIC_MESSAGES, OPENAI_CHAT): anthropic_messages_openai_chat,
}


class StreamConverter(Protocol):
    def feed(self, event: SSEEvent) -> list[bytes]: ...
    def finish(self) -> list[bytes]: ...


class Passthrough:
    """Forwards each upstream event's exact bytes; drops the usage chunk the gateway
    asked a Chat provider for on behalf of a client that did not."""

    def __init__(self, drop_usage_chunk: bool) -> None:
        self._drop_usage_chunk = drop_usage_chunk

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self._drop_usage_chunk and '"usage"' in event.data and event.data != "[DONE]":
            try:
                if openai_chat.is_usage_only_chunk(event.json()):
                    return []
            except ValueError:
                pass
        return [event.raw]

    def finish(self) -> list[bytes]:
        return []


@dataclass(frozen=True)
class Route:
    client: ModuleType
    upstream: ModuleType
    translator: ModuleType | None

    def upstream_body(self, request: ParsedRequest, target: Target, cap_output: bool) -> bytes:
        if self.translator is None:
            return self.upstream.passthrough_body(request, target.model, target.max_output_tokens if cap_output else None)
        try:
            converted = self.translator.convert_request(request.body, target)
        except (TypeError, AttributeError, KeyError, ValueError) as error:
            # The translators check the fields they convert; a shape they did not foresee
            # is still the client's input, so it is a 400, not a gateway failure.
            log.warning("request conversion to %s failed on an unexpected shape (%s)", self.upstream.NAME, type(error).__name__)
            raise invalid(f"the request cannot be converted for this model's provider ({self.upstream.NAME})") from None
        if cap_output:
            field = "max_tokens" if self.upstream is anthropic_messages else "max_completion_tokens"
            converted[field] = min(converted.get(field) or target.max_output_tokens, target.max_output_tokens)
        return json.dumps(converted, ensure_ascii=False, separators=(",", ":")).encode()

    def client_body(self, raw: bytes, document: dict[str, Any], created: int) -> bytes:
        if self.translator is None:
            return raw
        return json.dumps(self.translator.convert_response(document, created), ensure_ascii=False).encode()

    def stream_converter(self, request: ParsedRequest, created: int) -> StreamConverter:
        wants_usage = request.protocol != OPENAI_CHAT or openai_chat.client_wants_usage(request)
        if self.translator is None:
            return Passthrough(drop_usage_chunk=not wants_usage)
        return self.translator.StreamConverter(wants_usage, created)


def route(client_protocol: str, upstream_protocol: str) -> Route:
    client = PROTOCOLS[client_protocol]
    if client_protocol == upstream_protocol:
        return Route(client, client, None)
    return Route(client, PROTOCOLS[upstream_protocol], TRANSLATORS[(client_protocol, upstream_protocol)])
