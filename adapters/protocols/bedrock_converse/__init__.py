"""Bedrock Runtime's Converse API (``POST /model/{modelId}/converse`` and
``/converse-stream``): ``wire``, ``surfaces`` and ``tools``."""

from __future__ import annotations

from portcullis.adapters.protocols.bedrock_converse import surfaces, tools, wire
from portcullis.adapters.protocols.interfaces import WireProtocol

PROTOCOL = WireProtocol("bedrock_converse", wire, surfaces, tools)
