"""The one fake upstream model provider, used by every test and by the benchmark.

It speaks the real wire formats, JSON and SSE, tool calls, usage and the providers'
error envelopes; it checks the provider credential the way the real APIs do, records
every request it receives (headers and exact body bytes) and can be scripted per
upstream model to fail, hang, cut a stream or answer with tool calls.

The package's shape:

- ``behaviours``: what a test scripts (``Reply``, ``Fail``, ``Hang``, ...) and what the
  fake records (``Received``), the same for every format;
- ``wire``: JSON and SSE framing and stream pacing, shared by the formats;
- one module per wire format: ``anthropic_messages`` (``/v1/messages``),
  ``openai_chat`` (``/v1/chat/completions``) and ``openai_responses``
  (``/v1/responses``) and ``bedrock_runtime`` (``/model/{id}/converse``, ``/invoke``
  and their streams, signed with SigV4: ``sigv4`` holds the fake AWS account and checks
  signatures), each with its ``PATH`` and ``async handle(fake, request)`` and its
  bodies, events and errors (``MORE_ROUTES`` maps further paths to their handlers:
  Anthropic's ``/v1/messages/count_tokens``, Bedrock's other operations);
- ``server``: ``FakeProvider``, which routes every module in ``WIRE_FORMATS``.

A new wire format is one more module of that kind,
added to ``server.WIRE_FORMATS``.

Run standalone for benchmarks:  python -m tests.fakes --port 9100
"""

from tests.fakes.behaviours import Behaviour, CutStream, Fail, Hang, Intervene, Received, Redirect, Reply, StreamError, ToolCall
from tests.fakes.server import FakeProvider, free_port

__all__ = ["Behaviour", "CutStream", "Fail", "FakeProvider", "Hang", "Intervene", "Received", "Redirect", "Reply", "StreamError", "ToolCall", "free_port"]
