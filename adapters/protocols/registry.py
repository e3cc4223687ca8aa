"""The protocols this gateway speaks, the translators between them, and which code
path serves a (client protocol, provider protocol) pair.

Same protocol: the client's bytes go upstream (only the model name swapped, and the
output limit when it must be capped) and the provider's bytes come back. Different
protocols: the pair's translator converts the request, the response and the stream;
a pair without one is refused (a 400 for that target, so the dispatcher tries the
next one)."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.json_bytes import compact
from portcullis.adapters.protocols import anthropic_messages, bedrock_converse, bedrock_invoke, openai_chat, openai_responses
from portcullis.adapters.protocols.interfaces import StreamConverter, Surfaces, TokenCounting, ToolCalls, Translator, Wire, WireProtocol
from portcullis.adapters.protocols.jsonbody import invalid
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import ToolCall
from portcullis.adapters.protocols.translators import (
    anthropic_messages_to_bedrock_converse,
    anthropic_messages_to_bedrock_invoke,
    anthropic_messages_to_openai_chat,
    anthropic_messages_to_openai_responses,
    bedrock_converse_to_anthropic_messages,
    bedrock_invoke_to_anthropic_messages,
    openai_chat_to_anthropic_messages,
    openai_chat_to_openai_responses,
    openai_responses_to_anthropic_messages,
    openai_responses_to_openai_chat,
)
from portcullis.adapters.protocols.translators.composed import Composed
from portcullis.engine.plan import Target

log = logging.getLogger("portcullis.protocols")

PROTOCOLS: dict[str, WireProtocol] = {
    p.name: p for p in (anthropic_messages.PROTOCOL, openai_chat.PROTOCOL, openai_responses.PROTOCOL, bedrock_converse.PROTOCOL, bedrock_invoke.PROTOCOL)
}
TRANSLATORS: dict[tuple[str, str], Translator] = {
    (openai_chat.PROTOCOL.name, anthropic_messages.PROTOCOL.name): openai_chat_to_anthropic_messages,
    (anthropic_messages.PROTOCOL.name, openai_chat.PROTOCOL.name): anthropic_messages_to_openai_chat,
    (openai_chat.PROTOCOL.name, openai_responses.PROTOCOL.name): openai_chat_to_openai_responses,
    (anthropic_messages.PROTOCOL.name, openai_responses.PROTOCOL.name): anthropic_messages_to_openai_responses,
    (openai_responses.PROTOCOL.name, anthropic_messages.PROTOCOL.name): openai_responses_to_anthropic_messages,
    (openai_responses.PROTOCOL.name, openai_chat.PROTOCOL.name): openai_responses_to_openai_chat,
    (anthropic_messages.PROTOCOL.name, bedrock_converse.PROTOCOL.name): anthropic_messages_to_bedrock_converse,
    (bedrock_converse.PROTOCOL.name, anthropic_messages.PROTOCOL.name): bedrock_converse_to_anthropic_messages,
    (anthropic_messages.PROTOCOL.name, bedrock_invoke.PROTOCOL.name): anthropic_messages_to_bedrock_invoke,
    (bedrock_invoke.PROTOCOL.name, anthropic_messages.PROTOCOL.name): bedrock_invoke_to_anthropic_messages,
}
# The name a client knows each protocol's route by (``policy eval --protocol``).
ROUTE_NAMES = {
    "messages": anthropic_messages.PROTOCOL.name,
    "chat": openai_chat.PROTOCOL.name,
    "responses": openai_responses.PROTOCOL.name,
    "converse": bedrock_converse.PROTOCOL.name,
    "invoke": bedrock_invoke.PROTOCOL.name,
}
# The protocols whose model and operation are read from the path (Bedrock Runtime's
# /model/{modelId}/{action}): the action of a call and of its stream.
PATH_ACTIONS = {
    bedrock_converse.PROTOCOL.name: ("converse", bedrock_converse.wire.STREAM_ACTION),
    bedrock_invoke.PROTOCOL.name: ("invoke", bedrock_invoke.wire.STREAM_ACTION),
}
# The protocol that reads each action (whether it streams is the protocol's to read).
PATH_OPERATIONS = {action: name for name, actions in PATH_ACTIONS.items() for action in actions}
# Pairs without a translator of their own go through this protocol, when both halves exist.
HUB = anthropic_messages.PROTOCOL.name
# The protocol of the gateway's own calls (a classifier's) to a provider that speaks
# every protocol (the mock).
DEFAULT_UPSTREAM = openai_chat.PROTOCOL.name


def interface_members(interface: type) -> list[str]:
    """The names a module must define to satisfy ``interface`` (a typing.Protocol)."""
    names = set(getattr(interface, "__annotations__", {}))
    names |= {name for name, value in vars(interface).items() if not name.startswith("_") and callable(value)}
    return sorted(names)


def _check(module: Any, interface: type, where: str) -> None:
    # isinstance with a runtime_checkable Protocol says only that something is missing;
    # a protocol package missing a member should fail at import, naming it.
    if isinstance(module, interface):
        return
    missing = [name for name in interface_members(interface) if not hasattr(module, name)]
    raise ImportError(f"{where} does not satisfy {interface.__name__}: missing {', '.join(missing) or '(unknown)'}")


def _check_all() -> None:
    for name, entry in PROTOCOLS.items():
        if name != entry.wire.NAME:
            raise ImportError(f"protocol {name} is registered under another name than its wire's ({entry.wire.NAME})")
        _check(entry.wire, Wire, f"{name}.wire")
        _check(entry.surfaces, Surfaces, f"{name}.surfaces")
        _check(entry.tools, ToolCalls, f"{name}.tools")
        if entry.counting is not None:
            _check(entry.counting, TokenCounting, f"{name}.counting")
    for pair, translator in TRANSLATORS.items():
        _check(translator, Translator, "translator " + "_to_".join(pair))


_check_all()


def _through_hub(client_protocol: str, upstream_protocol: str) -> Translator | None:
    first, second = TRANSLATORS.get((client_protocol, HUB)), TRANSLATORS.get((HUB, upstream_protocol))
    if first is None or second is None:
        return None
    return Composed(first, second, PROTOCOLS[HUB].wire.FRAMING)


def protocol(name: str) -> WireProtocol:
    return PROTOCOLS[name]


class Passthrough:
    """Forwards each upstream event's exact bytes; drops the usage-only event the gateway
    asked the provider for on behalf of a client that did not."""

    def __init__(self, upstream: Wire, drop_usage_only: bool) -> None:
        self._upstream = upstream
        self._drop_usage_only = drop_usage_only

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self._drop_usage_only and '"usage"' in event.data and event.data != "[DONE]":
            try:
                if self._upstream.is_usage_only(event.json()):
                    return []
            except ValueError:
                pass
        return [self._upstream.FRAMING.frame(event)]

    def finish(self) -> list[bytes]:
        return []


@dataclass(frozen=True)
class Route:
    client: WireProtocol
    upstream: WireProtocol
    translator: Translator | None
    refusal: str | None = None  # why this pair cannot be served: no translator converts it

    def upstream_body(self, request: ParsedRequest, target: Target, cap_output: bool) -> bytes:
        """The body the provider gets; ``cap_output``: its output limit must not exceed the
        target's ceiling (a hard limit governs the request, so the reserved bound must hold)."""
        ceiling = target.max_output_tokens if cap_output else None
        if self.refusal is not None:
            raise invalid(self.refusal)
        if self.translator is None:
            return self.upstream.wire.passthrough_body(request, target.model, ceiling)
        try:
            converted = self.translator.convert_request(request.body, target, request.stream)
        except (TypeError, AttributeError, KeyError, ValueError) as error:
            # The translators check the fields they convert; a shape they did not foresee
            # is still the client's input, so it is a 400, not a gateway failure.
            log.warning("request conversion to %s failed on an unexpected shape (%s)", self.upstream.name, type(error).__name__)
            raise invalid(f"the request cannot be converted for this model's provider ({self.upstream.name})") from None
        # A pair whose provider reads in the body what the client sent as a header
        # (Bedrock's anthropic_beta list) carries it over.
        carry = getattr(self.translator, "carry_headers", None)
        if carry is not None:
            carry(converted, request.forward_headers)
        if ceiling is not None:
            self.upstream.wire.cap_output(converted, ceiling)
        return compact(converted)  # json.dumps's compact bytes, faster (json_bytes.py)

    def client_call(self, call: ToolCall) -> ToolCall:
        """A provider's tool call as the client will receive it: a translator that renames
        tools on the way up (``client_tool_call``) names them back, so policy judges the
        names the client declared."""
        rename = getattr(self.translator, "client_tool_call", None)
        return rename(call) if rename is not None else call

    def client_body(self, raw: bytes, document: dict[str, Any], created: int) -> bytes:
        if self.translator is None:
            return raw
        return json.dumps(self.translator.convert_response(document, created), ensure_ascii=False).encode()

    def stream_converter(self, request: ParsedRequest, created: int) -> StreamConverter:
        wants_usage = self.client.wire.client_wants_usage(request)
        if self.translator is None:
            return Passthrough(self.upstream.wire, drop_usage_only=not wants_usage)
        return self.translator.StreamConverter(wants_usage, created)


@functools.cache
def route(client_protocol: str, upstream_protocol: str) -> Route:
    client = PROTOCOLS[client_protocol]
    if client_protocol == upstream_protocol:
        return Route(client, client, None)
    upstream = PROTOCOLS[upstream_protocol]
    translator = TRANSLATORS.get((client_protocol, upstream_protocol)) or _through_hub(client_protocol, upstream_protocol)
    if translator is None:
        return Route(client, upstream, None, f"this model's provider speaks {upstream_protocol}; a {client_protocol} request cannot be converted")
    return Route(client, upstream, translator)
