"""Wire protocols, one package per protocol.

Each package (``anthropic_messages/``, ``openai_chat/``) holds three modules, each
satisfying an interface of ``interfaces``: ``wire`` (parsing and errors as ingress;
the upstream request, usage and stream events as egress), ``surfaces`` (the text the
provider reads and writes, for filters and guards) and ``tools`` (the model's tool
calls, judged whole); its ``PROTOCOL`` bundles them. ``translators/`` holds one
module per (client, provider) pair of different protocols. ``registry`` names the
protocols and translators and picks the route for a pair. Outside this package only
``providers`` and the HTTP routes (``app``, ``http_edge``) name a protocol.

Shared by every protocol: ``request`` (``ParsedRequest``), ``jsonbody`` (the strict
JSON reader and field helpers), ``validation`` (walking a body within limits),
``sse`` (event streams) and ``text`` (surfaces, visitors and tool calls as data).
See docs/adding-a-protocol.md.
"""
