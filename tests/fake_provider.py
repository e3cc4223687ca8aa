"""The one fake upstream model provider, used by every test and by the benchmark.

It speaks the real wire formats: Anthropic Messages (``/v1/messages``) and OpenAI
Chat Completions (``/v1/chat/completions``), JSON and SSE, tool calls, usage and the
providers' error envelopes. It checks the provider credential the way the real
APIs do, records every request it receives (headers and exact body bytes) and can be
scripted per upstream model to fail, hang, cut a stream or answer with tool calls.

Run standalone for benchmarks:  python tests/fake_provider.py --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:20]}")


@dataclass(frozen=True)
class Reply:
    """A successful answer. Usage is fixed so tests can compute exact costs."""

    text: str = "Hello from the fake provider."
    tool_calls: tuple[ToolCall, ...] = ()
    input_tokens: int = 100
    output_tokens: int = 20
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    delay: float = 0.0  # before the response starts
    event_delay: float = 0.0  # between stream events
    reports_usage: bool = True  # some OpenAI-compatible servers send no usage at all
    pieces: int = 3  # deltas each streamed text or tool input is split into
    echo: bool = False  # answer with the last user message's text, as the provider received it


@dataclass(frozen=True)
class Fail:
    """An error response, before anything is streamed."""

    status: int = 529
    retry_after: int | None = None


@dataclass(frozen=True)
class Hang:
    """Accept the connection and say nothing for ``seconds``."""

    seconds: float = 30.0


@dataclass(frozen=True)
class CutStream:
    """Stream ``after`` events of a normal reply, then drop the connection."""

    after: int = 3


@dataclass(frozen=True)
class StreamError:
    """Stream ``after`` events, then send the protocol's error event and stop."""

    after: int = 0
    error_type: str = "overloaded_error"


@dataclass(frozen=True)
class Redirect:
    """Answer 307 to another location (a misconfigured or hostile upstream)."""

    location: str


Behaviour = Reply | Fail | Hang | CutStream | StreamError | Redirect


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


class FakeProvider:
    def __init__(self, api_key: str = "sk-fake-upstream", name: str = "fake", default: Reply | None = None) -> None:
        self.api_key = api_key
        self.default = default or Reply()  # what an unscripted request gets
        self.accepted_keys = {api_key}  # a provider account can hold several keys
        self.name = name
        self.received: list[Received] = []
        self._scripts: dict[str, collections.deque[Behaviour]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._anthropic, methods=["POST"]),
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
            ]
        )

    # --- test-side controls -------------------------------------------------------------

    def script(self, model: str, *behaviours: Behaviour) -> None:
        """Queue behaviours for requests naming this upstream model; then default replies."""
        with self._lock:
            self._scripts[model].extend(behaviours)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.received.clear()
            self.accepted_keys = {self.api_key}

    def requests_for(self, model: str) -> list[Received]:
        return [r for r in self.received if _model_of(r.body) == model]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeProvider:
        self.port = port or free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"fake-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake provider did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _next(self, model: str) -> Behaviour:
        with self._lock:
            queue = self._scripts.get(model)
            return queue.popleft() if queue else self.default

    # --- Anthropic Messages ------------------------------------------------------------

    async def _anthropic(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(Received(request.url.path + (f"?{request.url.query}" if request.url.query else ""), dict(request.headers), body))
        if request.headers.get("x-api-key") not in self.accepted_keys:
            return _anthropic_error(401, "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return _anthropic_error(400, "anthropic-version: header is required")
        try:
            payload = json.loads(body)
        except ValueError:
            return _anthropic_error(400, "There was an issue with the format of your request: invalid JSON")
        for name in ("model", "max_tokens", "messages"):
            if name not in payload:
                return _anthropic_error(400, f"{name}: Field required")
        behaviour = self._next(payload["model"])
        if isinstance(behaviour, Redirect):
            return Response(status_code=307, headers={"location": behaviour.location})
        if isinstance(behaviour, Fail):
            return _anthropic_error(behaviour.status, "Overloaded" if behaviour.status == 529 else "fake failure", behaviour.retry_after)
        reply = _echoed(await _reply(behaviour), payload)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        if not payload.get("stream"):
            return _json(_anthropic_message(message_id, payload["model"], reply), {"request-id": f"req_{uuid.uuid4().hex[:20]}"})
        events = _anthropic_events(message_id, payload["model"], reply)
        return StreamingResponse(_paced(events, reply.event_delay, behaviour, _anthropic_error_event), media_type="text/event-stream")

    # --- OpenAI Chat ---------------------------------------------------------------------

    async def _openai(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(Received(request.url.path, dict(request.headers), body))
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.accepted_keys:
            return _openai_error(401, "Incorrect API key provided.", "invalid_api_key")
        try:
            payload = json.loads(body)
        except ValueError:
            return _openai_error(400, "We could not parse the JSON body of your request.")
        if "model" not in payload or "messages" not in payload:
            return _openai_error(400, "you must provide a model and messages parameter")
        behaviour = self._next(payload["model"])
        if isinstance(behaviour, Fail):
            return _openai_error(behaviour.status, "fake failure", retry_after=behaviour.retry_after)
        reply = _echoed(await _reply(behaviour), payload)
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not payload.get("stream"):
            return _json(_openai_completion(completion_id, payload["model"], reply), {"x-request-id": uuid.uuid4().hex})
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        events = _openai_events(completion_id, payload["model"], reply, include_usage)
        return StreamingResponse(_paced(events, reply.event_delay, behaviour, _openai_error_event), media_type="text/event-stream")


async def _reply(behaviour: Behaviour) -> Reply:
    """Wait as the behaviour says, then the answer to send or stream."""
    if isinstance(behaviour, Hang):
        await asyncio.sleep(behaviour.seconds)
    reply = behaviour if isinstance(behaviour, Reply) else Reply()
    if reply.delay:
        await asyncio.sleep(reply.delay)
    return reply


def _model_of(body: bytes) -> str | None:
    try:
        return json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None


def _json(document: Any, headers: dict[str, str]) -> Response:
    return Response(json.dumps(document), 200, headers=headers, media_type="application/json")


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def _paced(events: list[bytes], delay: float, behaviour: Behaviour, error_event: Any):
    for i, event in enumerate(events):
        if isinstance(behaviour, CutStream) and i == behaviour.after:
            raise ConnectionResetError("fake provider cut the stream")  # uvicorn drops the connection
        if isinstance(behaviour, StreamError) and i == behaviour.after:
            yield error_event(behaviour.error_type)
            return
        if delay:
            await asyncio.sleep(delay)
        yield event


def _echoed(reply: Reply, payload: dict[str, Any]) -> Reply:
    if not reply.echo:
        return reply
    said = ""
    for message in payload.get("messages") or []:
        if message.get("role") == "user":
            content = message.get("content")
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            said = " ".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return dataclasses.replace(reply, text=said)


def _split(text: str, parts: int = 3) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- Anthropic wire format -----------------------------------------------------------------


def _anthropic_usage(reply: Reply, output: int) -> dict[str, int]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": reply.cache_write_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
    }


def _anthropic_message(message_id: str, model: str, reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input} for call in reply.tool_calls]
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(reply, reply.output_tokens),
    }


def _anthropic_events(message_id: str, model: str, reply: Reply) -> list[bytes]:
    start = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _anthropic_usage(reply, 1),
    }
    events = [_sse({"type": "message_start", "message": start}, "message_start"), _sse({"type": "ping"}, "ping")]
    index = 0
    if reply.text:
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        for piece in _split(reply.text, reply.pieces):
            events.append(_sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for call in reply.tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"))
        for piece in _split(json.dumps(call.input), reply.pieces):
            events.append(
                _sse({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}, "content_block_delta")
            )
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    delta = {"stop_reason": "tool_use" if reply.tool_calls else "end_turn", "stop_sequence": None}
    events.append(_sse({"type": "message_delta", "delta": delta, "usage": {"output_tokens": reply.output_tokens}}, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


def _anthropic_error(status: int, message: str, retry_after: int | None = None) -> Response:
    headers = {"request-id": f"req_{uuid.uuid4().hex[:20]}"}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    body = {"type": "error", "error": {"type": _ANTHROPIC_ERRORS.get(status, "api_error"), "message": message}}
    return Response(json.dumps(body), status, headers=headers, media_type="application/json")


def _anthropic_error_event(error_type: str) -> bytes:
    return _sse({"type": "error", "error": {"type": error_type, "message": "Overloaded"}}, "error")


# --- OpenAI wire format --------------------------------------------------------------------


def _openai_usage(reply: Reply) -> dict[str, Any]:
    prompt = reply.input_tokens + reply.cache_read_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reply.output_tokens,
        "total_tokens": prompt + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _openai_completion(completion_id: str, model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}} for call in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
        **({"usage": _openai_usage(reply)} if reply.reports_usage else {}),
        "system_fingerprint": "fp_fake",
    }


def _openai_events(completion_id: str, model: str, reply: Reply, include_usage: bool) -> list[bytes]:
    envelope = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake"}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": piece}) for piece in _split(reply.text, reply.pieces)]
    for i, call in enumerate(reply.tool_calls):
        events.append(chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}) for piece in _split(json.dumps(call.input), reply.pieces)]
    events.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if include_usage and reply.reports_usage:
        events.append(_sse({**envelope, "choices": [], "usage": _openai_usage(reply)}))
    events.append(b"data: [DONE]\n\n")
    return events


def _openai_error(status: int, message: str, code: str | None = None, retry_after: int | None = None) -> Response:
    kinds = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error", 429: "requests"}
    headers = {"x-request-id": uuid.uuid4().hex}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    body = {"error": {"message": message, "type": kinds.get(status, "server_error"), "param": None, "code": code}}
    return Response(json.dumps(body), status, headers=headers, media_type="application/json")


def _openai_error_event(error_type: str) -> bytes:
    return _sse({"error": {"message": "The server had an error while processing your request.", "type": "server_error", "param": None, "code": None}})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run the fake provider on its own (benchmarks).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default="sk-fake-upstream")
    parser.add_argument("--echo", action="store_true", help="answer every request with its last user message")
    args = parser.parse_args()
    fake = FakeProvider(args.api_key, default=Reply(echo=True) if args.echo else None)
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off", http="httptools", loop="uvloop")
