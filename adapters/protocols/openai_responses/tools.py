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
    """From a call item's ``response.output_item.added`` until every open call's
    ``response.output_item.done`` each event is held (in order; calls may interleave);
    then each call is judged whole. Allowed calls go out as they came; a denied call's
    events are replaced, where it was opened, by those of a message item carrying the
    denial. Output indexes stay; sequence numbers are written again so they still count
    up by one. The final response's output gets the same replacement. A call that grows
    past ``MAX_HELD_TOOL_CALL_BYTES`` is denied there and the rest of it dropped."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[SSEEvent] = []
        self._open: dict[Any, dict[str, Any]] = {}  # output index -> the call as streamed so far
        self._closed: dict[Any, dict[str, Any]] = {}  # calls whole, waiting for the others
        self._size = 0
        self._shift = 0  # added to every later sequence number
        self._dropping: set[Any] = set()  # items denied before their end: their remaining events go
        self._replaced: dict[Any, dict[str, Any]] = {}  # output index -> the message in its place

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        quiet = not self._held and not self._shift and not self._replaced and not self._dropping
        if quiet and '"response.output_item.added"' not in event.data:
            return [event]  # nothing to hold and nothing to renumber: the provider's bytes
        document = _json(event)
        if document is None:
            return self._hold(event) if self._held else [event]
        index, kind, item = document.get("output_index"), document.get("type"), document.get("item")
        if index in self._dropping and kind != "response.output_item.added":
            if kind == "response.output_item.done":
                self._dropping.discard(index)
            self._shift -= 1
            return []
        if kind == "response.output_item.added" and isinstance(item, dict) and item.get("type") in CALL_ITEMS:
            self._open[index] = {"item": item, "parts": []}
            return self._hold(event)
        if not self._held:
            return [self._renumbered(event, document)]
        if kind in _FINAL or kind == "error":  # the stream ends before the calls do
            return self._release(_INCOMPLETE) + self.feed(event)
        call = self._open.get(index)
        if call is not None and kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            call["parts"].append(document["delta"] if isinstance(document.get("delta"), str) else "")
        held = self._hold(event)
        if call is not None and kind == "response.output_item.done":
            if isinstance(item, dict):
                call["item"] = item
            self._closed[index] = self._open.pop(index)
        if self._size > MAX_HELD_TOOL_CALL_BYTES:
            return self._release(TOO_LARGE_TO_INSPECT)
        return self._release(None) if not self._open else held

    def finish(self) -> list[SSEEvent]:
        """A stream that ended inside a call: the call never completed, so it is denied."""
        return self._release(_INCOMPLETE) if self._held else []

    def _hold(self, event: SSEEvent) -> list[SSEEvent]:
        self._held.append(event)
        self._size += len(event.data)
        return []

    def _release(self, open_reason: str | None) -> list[SSEEvent]:
        """Judges the whole calls, denies the open ones with ``open_reason``, and lets the
        held events go."""
        held, opened, closed = self._held, self._open, self._closed
        self._held, self._open, self._closed, self._size = [], {}, {}, 0
        denied: dict[Any, dict[str, Any]] = {}
        for index, state in [*closed.items(), *opened.items()]:
            item = dict(state["item"])
            field = "arguments" if item.get("type") == "function_call" else "input"
            if index in opened or not isinstance(item.get(field), str) or not _whole(item):
                item[field] = "".join(state["parts"])
            call = call_of(item)
            reason = open_reason if index in opened else self._judge(call)
            if reason is not None:
                denied[index] = denial_item(item, denial_text(call, reason))
        if open_reason == TOO_LARGE_TO_INSPECT:
            self._dropping |= set(opened)
        if not denied:
            return [self._renumbered(e, _json(e)) for e in held] if self._shift else held
        self._replaced.update(denied)
        kept: list[tuple[SSEEvent, dict[str, Any] | None]] = []  # the document when it is to be written again
        for event in held:
            document = _json(event)
            index = document.get("output_index") if document is not None else None
            if document is None or index not in denied:
                kept.append((event, document))
            elif document.get("type") == "response.output_item.added":
                kept += [(e, e.json()) for e in _message_events(denied[index], index, 0)]
        first, last = _json(held[0]) or {}, _json(held[-1]) or {}
        if not isinstance(first.get("sequence_number"), int) or not isinstance(last.get("sequence_number"), int):
            return [event if document is None else event_of(document, event.event) for event, document in kept]
        base = first["sequence_number"] + self._shift
        out = []
        for event, document in kept:
            if document is not None and isinstance(document.get("sequence_number"), int):
                document["sequence_number"] = base + len(out)
            out.append(event if document is None else event_of(document, event.event))
        self._shift = base + len(out) - (last["sequence_number"] + 1)
        return out

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
