"""An Anthropic Messages client served through Bedrock InvokeModel.

Near-passthrough: the body is the client's, its members in their order and every
``cache_control`` breakpoint as sent; only the envelope changes (``model`` and
``stream`` leave the body for the path, ``anthropic_version`` joins it, the client's
``anthropic-beta`` header becomes the ``anthropic_beta`` list Bedrock reads). The answer
and each unwrapped stream event are Messages ones already: only the invocation
metrics Bedrock adds are taken off, and the events go back out as server-sent events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.bedrock_invoke.envelope import BETA_MEMBER, MESSAGES_ONLY, VERSION, VERSION_MEMBER, header_betas
from portcullis.adapters.protocols.bedrock_invoke.wire import METRICS
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.engine.plan import Target

TARGET = "Bedrock InvokeModel"


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    """The client's body, as it was, in the Invoke envelope (the path names the model and the stream)."""
    out: dict[str, Any] = {VERSION_MEMBER: VERSION}
    out.update((name, value) for name, value in body.items() if name not in MESSAGES_ONLY and name != VERSION_MEMBER)
    return out


def carry_headers(body: dict[str, Any], forward: Mapping[str, str]) -> None:
    """The client's ``anthropic-beta`` header as the body's beta list, after any the body names."""
    betas = header_betas(forward)
    if not betas:
        return
    named = body.get(BETA_MEMBER)
    listed = list(named) if isinstance(named, list) else []
    body[BETA_MEMBER] = listed + [beta for beta in betas if beta not in listed]


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    return {name: value for name, value in document.items() if name != METRICS}


class StreamConverter:
    """Each unwrapped Messages event as the server-sent event it was before Bedrock
    wrapped it."""

    def __init__(self, wants_usage: bool, created: int) -> None:
        pass  # a Messages stream always carries usage; nothing depends on the clock

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.event == "message_stop" and METRICS in event.data:
            document = event.json()
            document.pop(METRICS, None)
            return [encode(document, event.event)]
        return [encode(event.data, event.event)]

    def finish(self) -> list[bytes]:
        return []
