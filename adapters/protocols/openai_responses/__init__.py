"""OpenAI Responses (``POST /v1/responses``): ``wire``, ``surfaces`` and ``tools``. The
protocol of Codex CLI and the openai SDK's ``client.responses``; as a provider protocol
it serves OpenAI and compatible servers configured with ``wire: responses``;
``input_tokens`` for ``POST /v1/responses/input_tokens``."""

from __future__ import annotations

from portcullis.adapters.protocols.interfaces import WireProtocol
from portcullis.adapters.protocols.openai_responses import input_tokens, surfaces, tools, wire

PROTOCOL = WireProtocol(name=wire.NAME, wire=wire, surfaces=surfaces, tools=tools, counting=input_tokens)
