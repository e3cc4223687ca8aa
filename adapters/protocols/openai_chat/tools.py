"""OpenAI Chat: the tool calls of an answer (function, custom and legacy
function_call), found, denied in place and held in a stream until each is whole."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from portcullis.adapters.protocols.sse import SSEEvent, event_of
from portcullis.adapters.protocols.text import MAX_HELD_TOOL_CALL_BYTES, TOO_LARGE_TO_INSPECT, ToolCall, denial_text, tool_call

# A call's key: (choice position, call index), or (choice, LEGACY) for a legacy
# ``function_call``, which a message holds at most once.
LEGACY = -1


def answer_tool_calls(document: Mapping[str, Any]) -> list[tuple[tuple[int, int], ToolCall]]:
    """Every choice's calls: function and custom tool calls, and a legacy function_call."""
    calls = []
    for c, choice in enumerate(document.get("choices") or ()):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for i, call in enumerate(message.get("tool_calls") or ()):
            calls.append(((c, i), _call_of(call)))
        if message.get("function_call") is not None:
            calls.append(((c, LEGACY), _call_of({"function": message["function_call"]})))
    return calls


def _call_of(entry: Any) -> ToolCall:
    """A tool-call entry: ``function`` (arguments as JSON text) or ``custom`` (free-form
    input, judged as the argument ``input``). Anything else has no name to allow."""
    entry = entry if isinstance(entry, dict) else {}
    if isinstance(entry.get("custom"), dict):
        custom = entry["custom"]
        return ToolCall(custom.get("name") if isinstance(custom.get("name"), str) else "", {"input": custom.get("input")})
    function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
    return tool_call(function.get("name"), function.get("arguments"))


def deny_tool_calls(document: dict[str, Any], denials: Mapping[tuple[int, int], str]) -> None:
    """Denied calls leave the message and their texts join its content; a choice left
    without a call stops instead of asking for tools."""
    for c, choice in enumerate(document["choices"]):
        texts = [text for (dc, _), text in sorted(denials.items()) if dc == c]
        if not texts:
            continue
        message = choice["message"]
        kept = [call for i, call in enumerate(message.get("tool_calls") or ()) if (c, i) not in denials]
        message["content"] = "\n\n".join([message["content"], *texts] if message.get("content") else texts)
        if kept:
            message["tool_calls"] = kept
        else:
            message.pop("tool_calls", None)
        if (c, LEGACY) in denials:
            message.pop("function_call", None)
        if not kept and choice.get("finish_reason") in ("tool_calls", "function_call") and message.get("function_call") is None:
            choice["finish_reason"] = "stop"


class ToolCallStream:
    """From a choice's first tool-call delta until its finish_reason every chunk is
    held (in order); then each call is judged whole. Allowed calls go out as they came
    (renumbered when one before them was denied); a denied call's deltas are dropped
    and its text goes out as content before the finishing chunk. A call that grows
    past ``MAX_HELD_TOOL_CALL_BYTES`` is denied there: its deltas are dropped as they
    arrive, and the stream is still held until the choice finishes."""

    def __init__(self, judge: Callable[[ToolCall], str | None]) -> None:
        self._judge = judge
        self._held: list[tuple[SSEEvent, dict[str, Any] | None]] = []
        self._calls: dict[tuple[int, int], dict[str, Any]] = {}
        self._too_large: set[tuple[int, int]] = set()
        self._open: set[int] = set()
        self._size = 0

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if not self._held and "tool_calls" not in event.data and "function_call" not in event.data:
            return [event]
        document = None if event.data == "[DONE]" else event.json()
        for choice in (document or {}).get("choices") or ():
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            listed = delta.get("tool_calls") if isinstance(delta.get("tool_calls"), list) else ()  # servers may send null
            pieces = [((index, call.get("index", 0)), call) for call in listed if isinstance(call, dict)]
            if isinstance(delta.get("function_call"), dict):
                pieces.append(((index, LEGACY), {"function": delta["function_call"]}))
            for key, call in pieces:
                self._open.add(index)
                if key in self._too_large:
                    continue
                state = self._calls.setdefault(key, {"name": "", "parts": [], "custom": False})
                spec = call.get("custom") if isinstance(call.get("custom"), dict) else call.get("function") or {}
                state["custom"] = state["custom"] or isinstance(call.get("custom"), dict)
                state["name"] += spec.get("name") or ""
                piece = spec.get("input") if state["custom"] else spec.get("arguments")
                state["parts"].append(piece if isinstance(piece, str) else "")
                state["size"] = state.get("size", 0) + len(state["parts"][-1])
                self._size += len(state["parts"][-1])
                if self._size > MAX_HELD_TOOL_CALL_BYTES:
                    self._deny_too_large(key)
            if choice.get("finish_reason") is not None:
                self._open.discard(index)
        self._held.append((event, self._without(document, self._too_large, {})))
        if self._open and document is not None:
            return []
        return self._release()

    def finish(self) -> list[SSEEvent]:
        return self._release() if self._held else []

    def _deny_too_large(self, key: tuple[int, int]) -> None:
        """The call that outgrew the limit is denied now; what it held is dropped (the
        held events are written again from their documents, so its bytes go too)."""
        self._too_large.add(key)
        self._size -= self._calls[key].get("size", 0)
        self._calls[key]["parts"] = []
        self._held = [(event if document is None else event_of(self._without(document, {key}, {})), document) for event, document in self._held]

    def _release(self) -> list[SSEEvent]:
        denied: dict[tuple[int, int], str] = {}
        for key, state in self._calls.items():
            text = "".join(state["parts"])
            call = ToolCall(state["name"], {"input": text}) if state["custom"] else tool_call(state["name"], text)
            reason = TOO_LARGE_TO_INSPECT if key in self._too_large else self._judge(call)
            if reason is not None:
                denied[key] = denial_text(call, reason)
        held, calls = self._held, self._calls
        self._held, self._calls, self._open, self._size = [], {}, set(), 0
        if not denied:
            return [event for event, _ in held]
        kept = {c: sorted(i for (cc, i) in calls if cc == c and i != LEGACY and (cc, i) not in denied) for c, _ in calls}
        renumber = {(c, old): new for c, indexes in kept.items() for new, old in enumerate(indexes)}
        noted: set[int] = set()
        out = []
        for event, document in held:
            if document is None:  # [DONE]: a choice that never finished still gets its note
                out += [self._note(held, c, denied) for c in sorted({c for c, _ in denied} - noted)]
                noted |= {c for c, _ in denied}
                out.append(event)
                continue
            document = self._without(document, set(denied), renumber)
            for choice in document.get("choices") or ():
                c = choice.get("index", 0)
                if choice.get("finish_reason") is not None and any(dc == c for dc, _ in denied) and c not in noted:
                    out.append(self._note(held, c, denied))
                    noted.add(c)
                    still_calls = kept.get(c) or ((c, LEGACY) in calls and (c, LEGACY) not in denied)
                    if choice["finish_reason"] in ("tool_calls", "function_call") and not still_calls:
                        choice["finish_reason"] = "stop"
            out.append(event_of(document))
        out += [self._note(held, c, denied) for c in sorted({c for c, _ in denied} - noted)]
        return out

    @staticmethod
    def _without(document: dict[str, Any] | None, dropped: set[tuple[int, int]], renumber: Mapping[tuple[int, int], int]) -> Any:
        """The chunk without the deltas of ``dropped`` calls, the rest renumbered."""
        for choice in (document or {}).get("choices") or ():
            c, delta = choice.get("index", 0), choice.get("delta") or {}
            if isinstance(delta.get("tool_calls"), list):
                delta["tool_calls"] = [
                    dict(call, index=renumber.get((c, call.get("index", 0)), call.get("index", 0)))
                    for call in delta["tool_calls"]
                    if isinstance(call, dict) and (c, call.get("index", 0)) not in dropped
                ]
                if not delta["tool_calls"]:
                    del delta["tool_calls"]
            if (c, LEGACY) in dropped:
                delta.pop("function_call", None)
        return document

    @staticmethod
    def _note(held: list[tuple[SSEEvent, dict[str, Any] | None]], choice: int, denied: Mapping[tuple[int, int], str]) -> SSEEvent:
        """The denial texts of a choice, as a content chunk shaped like the stream's own."""
        template = next((document for _, document in held if document is not None), {})
        texts = [text for (c, _), text in sorted(denied.items()) if c == choice]
        note = {k: v for k, v in template.items() if k not in ("choices", "usage")}
        return event_of({**note, "choices": [{"index": choice, "delta": {"content": "\n\n".join(texts)}, "finish_reason": None}]})
