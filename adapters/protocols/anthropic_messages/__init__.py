"""Anthropic Messages (``POST /v1/messages``): ``wire``, ``surfaces`` and ``tools``;
``count_tokens`` for ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

from portcullis.adapters.protocols.anthropic_messages import count_tokens, surfaces, tools, wire
from portcullis.adapters.protocols.interfaces import WireProtocol

PROTOCOL = WireProtocol(name=wire.NAME, wire=wire, surfaces=surfaces, tools=tools, counting=count_tokens)
