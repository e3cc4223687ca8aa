"""OpenAI Chat Completions (``POST /v1/chat/completions``): ``wire``, ``surfaces`` and
``tools``. As a provider protocol it serves any OpenAI-compatible server."""

from __future__ import annotations

from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.openai_chat import surfaces, tools, wire

PROTOCOL = WireProtocol(name=wire.NAME, wire=wire, surfaces=surfaces, tools=tools)
