"""Anthropic Messages (``POST /v1/messages``): ``wire``, ``surfaces`` and ``tools``."""

from __future__ import annotations

from portcullis.adapters.protocols.anthropic_messages import surfaces, tools, wire
from portcullis.adapters.protocols.interfaces import WireProtocol

PROTOCOL = WireProtocol(name=wire.NAME, wire=wire, surfaces=surfaces, tools=tools)
