"""OpenAI Responses: the tool calls of an answer (``function_call`` and
``custom_tool_call`` output items), found, denied in place and held in a stream until
each is whole.

A custom tool's input is free text (a patch, a grammar's sentence), not JSON: it is
judged as the argument ``input``, so an allow-list still sees what the tool gets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import MAX_HELD_TOOL_CALL_BYTES, TOO_LARGE_TO_INSPECT, ToolCall, denial_text, tool_call

CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
_FINAL = ("response.completed", "response.incomplete", "response.failed")
_INCOMPLETE = "the call did not complete"


def call_of(item: Mapping[str, Any]) -> ToolCall:
    """A call item as the judge sees it; a namespaced function is ``namespace.name``."""
    name = item.get("name") if isinstance(item.get("name"), str) else ""
    if isinstance(item.get("namespace"), str):
        name = f"{item['namespace']}.{name}"
    if item.get("type") == "custom_tool_call":
        return ToolCall(name, {"input": item.get("input")})
    return tool_call(name, item.get("arguments"))


def answer_tool_calls(document: Mapping[str, Any]) -> list[tuple[int, ToolCall]]:
    """The client-run calls of an answer, by output position. Built-in tools run at the
    provider before the gateway sees them, so they are not the guard's."""
    return [
        (i, call_of(item)) for i, item in enumerate(document.get("output") or ()) if isinstance(item, dict) and item.get("type") in CALL_ITEMS
    ]


def denial_item(call_item: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The assistant message that stands where a denied call was."""
    ident = call_item.get("id") if isinstance(call_item.get("id"), str) else str(call_item.get("call_id") or "call")
    return {
        "id": f"msg_{ident}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def deny_tool_calls(document: dict[str, Any], denials: Mapping[int, str]) -> None:
    """Denied calls become assistant messages carrying their denial texts, in place (a
    Responses answer has no stop reason to fix: the client sees no call to run)."""
    output = document["output"]
    for position, text in denials.items():
        output[position] = denial_item(output[position], text)


class ToolCallStream:
    """Holds a call item's events from its ``response.output_item.added`` until its
    ``response.output_item.done``, then releases them, or the events of a message item
    carrying the denial in its place. Output indexes stay; sequence numbers after a
    replacement are shifted so they still count up by one. The final response's output
    gets the same replacement."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._index: Any = None
        self._item: dict[str, Any] = {}
        self._parts: list[str] = []
        self._size = 0
        self._shift = 0  # added to every later sequence number
        self._dropping: Any = None  # an item denied before its end: its remaining events go
        self._replaced: dict[Any, dict[str, Any]] = {}  # output index -> the message in its place

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._held:
            return self._holding(event)
        if not self._shift and not self._replaced and self._dropping is None and '"response.output_item.added"' not in event.data:
            return [event]  # nothing to hold and nothing to renumber: the provider's bytes
        document = _json(event)
        if document is None:
            return [event]
        if self._dropping is not None and document.get("output_index") == self._dropping:
            if document.get("type") == "response.output_item.done":
                self._dropping = None
            self._shift -= 1
            return []
        item = document.get("item")
        if document.get("type") == "response.output_item.added" and isinstance(item, dict) and item.get("type") in CALL_ITEMS:
            self._held, self._index, self._item, self._parts, self._size = [event], document.get("output_index"), item, [], len(event.data)
            return []
        return [self._renumbered(event, document)]

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a call: the call never completed, so it is denied."""
        return self._decide(_INCOMPLETE) if self._held else []

    def _holding(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        document = _json(event) or {}
        kind = document.get("type")
        if kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta") and isinstance(document.get("delta"), str):
            self._parts.append(document["delta"])
        if kind in _FINAL or kind == "error":  # the stream ends before the call does
            held = self._held.pop()
            return self._decide(_INCOMPLETE) + self.feed(held)
        if kind == "response.output_item.done" and document.get("output_index") == self._index:
            if isinstance(document.get("item"), dict):
                self._item = document["item"]
            return self._decide(None)
        if self._size > MAX_HELD_TOOL_CALL_BYTES:
            return self._decide(TOO_LARGE_TO_INSPECT)
        return []

    def _decide(self, refused: str | None) -> list[SSEEvent]:
        held, self._held = self._held, []
        item = dict(self._item)
        if refused is not None or not isinstance(item.get("arguments" if item.get("type") == "function_call" else "input"), str) or not _whole(item):
            item["arguments" if item.get("type") == "function_call" else "input"] = "".join(self._parts)
        call = call_of(item)
        reason = refused or self._judge(call)
        if reason is None:
            return [self._renumbered(e, _json(e)) for e in held] if self._shift else held
        if refused == TOO_LARGE_TO_INSPECT:  # decided before the item ended: the rest of it is dropped as it comes
            self._dropping = self._index
        first = _json(held[0]) or {}
        number = first.get("sequence_number") if isinstance(first.get("sequence_number"), int) else 0
        message = denial_item(item, denial_text(call, reason))
        self._replaced[self._index] = message
        events = _message_events(message, self._index, number + self._shift)
        self._shift += len(events) - len(held)
        return events

    def _renumbered(self, event: SSEEvent, document: dict[str, Any] | None) -> SSEEvent:
        if document is None:
            return event
        changed = False
        if self._shift and isinstance(document.get("sequence_number"), int):
            document["sequence_number"] += self._shift
            changed = True
        response = document.get("response") if document.get("type") in _FINAL else None
        output = response.get("output") if isinstance(response, dict) else None
        if isinstance(output, list) and self._replaced:
            for index, message in self._replaced.items():
                if isinstance(index, int) and index < len(output) and isinstance(output[index], dict) and output[index].get("type") in CALL_ITEMS:
                    output[index] = message
                    changed = True
        return event_of(document, event.event) if changed else event


def _whole(item: Mapping[str, Any]) -> bool:
    return item.get("status") in (None, "completed")


def _json(event: SSEEvent) -> dict[str, Any] | None:
    try:
        document = event.json()
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _message_events(message: dict[str, Any], index: Any, number: int) -> list[SSEEvent]:
    """The events of a finished one-part message item, numbered from ``number``."""
    part = message["content"][0]
    text = part["text"]
    opened = {**message, "status": "in_progress", "content": []}
    common = {"item_id": message["id"], "output_index": index}
    documents: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": opened},
        {"type": "response.content_part.added", **common, "content_index": 0, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **common, "content_index": 0, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **common, "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **common, "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": message},
    ]
    return [event_of({**document, "sequence_number": number + i}, document["type"]) for i, document in enumerate(documents)]
