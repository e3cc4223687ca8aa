"""A Bedrock InvokeModel client (boto3 ``invoke_model``, ``anthropic.AnthropicBedrock``)
served by Anthropic directly.

The body is a Messages body already: ``model`` (the target's) and ``stream`` (the path
said so) join it, ``anthropic_version`` leaves it, and its ``anthropic_beta`` list goes
to the provider as the ``anthropic-beta`` header (the ingress parser put it in the
request's forwarded headers; the Messages wire sends them). The answer is returned as
Anthropic wrote it. Each stream event goes out in a ``chunk`` frame, as Bedrock frames
them, and the last one carries the token counts of ``amazon-bedrock-invocationMetrics``
(Bedrock's latencies are left out: the gateway does not measure the provider's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.anthropic_messages.wire import StreamUsage
from portcullis.adapters.protocols.bedrock_invoke.envelope import BETA_MEMBER, VERSION_MEMBER
from portcullis.adapters.protocols.bedrock_invoke.wire import METRICS
from portcullis.adapters.protocols.eventstream import INVOKE_FRAMING
from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.engine.plan import Target

TARGET = "Anthropic Messages"


def convert_request(body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": target.model}
    out.update((name, value) for name, value in body.items() if name not in (VERSION_MEMBER, BETA_MEMBER))
    if stream:
        out["stream"] = True
    return out


def convert_response(document: Mapping[str, Any], created: int) -> dict[str, Any]:
    return dict(document)


class StreamConverter:
    """Messages events in ``chunk`` frames; the usage they report is counted on the way,
    so the closing ``message_stop`` carries it as Bedrock's invocation metrics."""

    def __init__(self, wants_usage: bool, created: int) -> None:
        self._usage = StreamUsage()

    def feed(self, event: SSEEvent) -> list[bytes]:
        if event.event == "ping":  # Bedrock sends none; its clients expect Messages events only
            return []
        self._usage.feed(event)
        if event.event == "message_stop":
            document = event.json()
            document[METRICS] = self._metrics()
            event = event_of(document, event.event)
        return [INVOKE_FRAMING.frame(event)]

    def finish(self) -> list[bytes]:
        return []

    def _metrics(self) -> dict[str, int]:
        usage = self._usage.usage
        metrics = {"inputTokenCount": usage.input, "outputTokenCount": usage.output}
        if usage.cache_read:
            metrics["cacheReadInputTokenCount"] = usage.cache_read
        if usage.cache_write:
            metrics["cacheWriteInputTokenCount"] = usage.cache_write
        return metrics
