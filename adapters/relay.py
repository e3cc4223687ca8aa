"""A provider's stream on its way to the client: metered, guarded, converted.

Up to the first event nothing is committed: a provider that accepts the stream and
then fails at once (an error event first, a malformed or empty stream) is still a
failover case, because the client has seen nothing (``open`` raises ``TryNext``).
From the first byte out the response is committed: a failure then ends the stream
with an error event in the client's protocol, never a retry. Usage is read off the
provider's own events before any guard sees them, and however the stream ends —
completed, failed, or the client gone — ``finish`` runs once with its outcome.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from portcullis.adapters.pipeline import Exchange, ResponseGuard
from portcullis.adapters.protocols.interfaces import StreamConverter
from portcullis.adapters.protocols.jsonbody import error_message
from portcullis.adapters.protocols.registry import Route
from portcullis.adapters.protocols.sse import SSEError, SSEEvent
from portcullis.adapters.providers import UpstreamResponse, UpstreamUnreachable
from portcullis.adapters.upstream_errors import TryNext, clip, unreachable
from portcullis.engine.account_details import without_account_details
from portcullis.engine.errors import ErrorKind, GatewayError

log = logging.getLogger("portcullis.gateway")

Finish = Callable[[str, "GatewayError | None"], Awaitable[None]]  # (outcome, error): settle and audit


class StreamRelay:
    def __init__(self, exchange: Exchange, pair: Route, upstream: UpstreamResponse, guards: list[ResponseGuard], finish: Finish) -> None:
        self._exchange = exchange
        self._pair = pair
        self._upstream = upstream
        self._guards = guards
        self._finish = finish
        self._parser = pair.upstream.wire.FRAMING.Parser()
        self._meter = pair.upstream.wire.StreamUsage()
        self._chunks = upstream.chunks()
        self._pending: list[SSEEvent] = []

    async def open(self) -> None:
        """Read up to the first event; a stream that fails before it is the next target's turn."""
        try:
            while not self._pending:
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    self._pending = self._parser.close()
                    if not self._pending:
                        raise TryNext("empty_stream", GatewayError(ErrorKind.UPSTREAM, "the provider closed the stream without sending anything"))
                    break
                self._pending = self._parser.feed(chunk)
        except UpstreamUnreachable as failure:
            await self._abandon()
            raise TryNext(failure.reason, unreachable(failure)) from None
        except SSEError:
            await self._abandon()
            raise TryNext("malformed_stream", GatewayError(ErrorKind.UPSTREAM, "the provider sent a malformed stream")) from None
        except TryNext:
            await self._abandon()
            raise
        if self._pair.upstream.wire.is_error_event(self._pending[0]):
            await self._abandon()
            raise TryNext("error_event", GatewayError(ErrorKind.UPSTREAM, "the provider failed before streaming any output"))

    async def body(self, converter: StreamConverter) -> AsyncGenerator[bytes, None]:
        """The client's bytes, from the first event on. Must be started (its first
        ``anext``) for its ``finally`` — settlement and audit — to run when closed."""
        exchange, upstream_wire = self._exchange, self._pair.upstream.wire
        outcome, error = "cancelled", None
        pending = self._pending
        try:
            while True:
                batch, failed = [], None
                for event in pending:
                    self._meter.feed(event)
                    if upstream_wire.is_error_event(event):
                        failed = without_account_details(error_message(event.json()) or "the provider reported an error")
                        break
                    batch.append(event)
                for event in await self._guarded(batch):  # what came before the error still goes out
                    for out in converter.feed(event):
                        yield out
                if failed is not None:
                    raise GatewayError(ErrorKind.UPSTREAM, f"the provider failed mid-stream: {clip(failed)}")
                chunk = await anext(self._chunks, None)
                if chunk is None:
                    break
                pending = self._parser.feed(chunk)
            closing = self._parser.close()
            for event in closing:
                self._meter.feed(event)
            if not self._meter.complete:
                raise GatewayError(ErrorKind.UPSTREAM, "the provider ended the stream before it completed")
            for event in await self._guarded(closing, finish=True):
                for out in converter.feed(event):
                    yield out
            for out in converter.finish():
                yield out
            outcome = "ok"
        except UpstreamUnreachable as failure:
            outcome, error = "failed", GatewayError(ErrorKind.UPSTREAM, f"the provider connection failed mid-stream ({failure.reason})")
            yield exchange.protocol.wire.stream_error(error)
        except (GatewayError, SSEError, ValueError) as failure:
            error = failure if isinstance(failure, GatewayError) else GatewayError(ErrorKind.UPSTREAM, "the provider sent a malformed stream")
            outcome = "failed"
            yield exchange.protocol.wire.stream_error(error)
        except Exception:  # a gateway bug mid-stream: end the stream cleanly, keep the record
            log.exception("request %s: unexpected error while relaying the stream", exchange.request_id)
            outcome, error = "failed", GatewayError(ErrorKind.INTERNAL, "internal gateway error", code="internal_error")
            yield exchange.protocol.wire.stream_error(error)
        finally:
            await self._abandon()
            exchange.usage, exchange.usage_complete = self._meter.usage, self._meter.complete and self._meter.known
            if self._meter.intervened:
                exchange.audit_outcome["guardrail_intervened"] = True
            await self._finish(outcome, error)

    async def _guarded(self, events: list[SSEEvent], finish: bool = False) -> list[SSEEvent]:
        """Events through every guard in order; at the end each guard also releases what
        it held, and that passes through the guards after it."""
        for guard in self._guards:
            events = await guard.events(events)
            if finish:
                events = [*events, *await guard.finish()]
        return events

    async def _abandon(self) -> None:
        """Stop reading the provider's response: closing it is what stops the generation."""
        await self._chunks.aclose()
        self._upstream.release()
