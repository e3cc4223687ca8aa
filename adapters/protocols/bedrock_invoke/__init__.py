"""Bedrock Runtime InvokeModel for Anthropic models (``POST /model/{modelId}/invoke``,
``/invoke-with-response-stream``): its own ``wire``; ``surfaces`` and ``tools`` are the
Messages protocol's, since the body, the answer and the unwrapped stream events are
Messages ones."""

from __future__ import annotations

from portcullis.adapters.protocols.anthropic_messages import surfaces, tools
from portcullis.adapters.protocols.bedrock_invoke import wire
from portcullis.adapters.protocols.interfaces import WireProtocol

PROTOCOL = WireProtocol(name=wire.NAME, wire=wire, surfaces=surfaces, tools=tools)
