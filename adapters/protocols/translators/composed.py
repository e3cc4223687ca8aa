"""Two translators end to end, through a protocol both speak (the hub): a client of
protocol A served by a provider of protocol C as A → B then B → C.

Pairs are written for what they convert (Anthropic Messages to and from each other
protocol); the rest are composed, so a new protocol needs translators to and from
the hub only, not to every other protocol. A stream goes through both converters:
the second's output, in the hub's framing, is parsed back into events for the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.interfaces import Framing, StreamConverter, Translator
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.text import ToolCall
from portcullis.engine.plan import Target


class Composed:
    """``first``: client protocol → hub; ``second``: hub → provider protocol."""

    def __init__(self, first: Translator, second: Translator, hub: Framing) -> None:
        self.first = first
        self.second = second
        self._hub = hub
        self.TARGET = second.TARGET

    def convert_request(self, body: Mapping[str, Any], target: Target, stream: bool) -> dict[str, Any]:
        return self.second.convert_request(self.first.convert_request(body, target, stream), target, stream)

    def convert_response(self, document: Mapping[str, Any], created: int) -> dict[str, Any]:
        return self.first.convert_response(self.second.convert_response(document, created), created)

    def StreamConverter(self, wants_usage: bool, created: int) -> StreamConverter:
        # The hub stream always carries usage: the first converter decides what the client gets.
        return _Chained(self.second.StreamConverter(True, created), self._hub, self.first.StreamConverter(wants_usage, created))

    def client_tool_call(self, call: ToolCall) -> ToolCall:
        """A provider's tool call named as the client declared it, through both renamings."""
        for translator in (self.second, self.first):
            rename = getattr(translator, "client_tool_call", None)
            if rename is not None:
                call = rename(call)
        return call


class _Chained:
    def __init__(self, inner: StreamConverter, hub: Framing, outer: StreamConverter) -> None:
        self._inner = inner
        self._parser = hub.Parser()
        self._outer = outer

    def feed(self, event: SSEEvent) -> list[bytes]:
        return self._through(self._inner.feed(event))

    def finish(self) -> list[bytes]:
        out = self._through(self._inner.finish())
        for event in self._parser.close():
            out.extend(self._outer.feed(event))
        return [*out, *self._outer.finish()]

    def _through(self, chunks: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for chunk in chunks:
            for event in self._parser.feed(chunk):
                out.extend(self._outer.feed(event))
        return out
