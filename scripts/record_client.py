"""Record what a coding agent sends to an OpenAI-style base URL, and answer it.

    .venv/bin/python scripts/record_client.py --log /tmp/codex.jsonl --scenario shell

Listens on 127.0.0.1 (`--port`, 0 picks a free one and prints it), writes one JSON
line per request (method, path, query, headers with credentials redacted, body parsed
when it is JSON) and answers:

- `POST /v1/responses` with a streamed Responses answer. `text`: a plain answer.
  `shell`: the first request of a session (its `session-id` header) that offers a
  shell tool asks for the shell command `--command` through it, the request that
  carries its output gets a final answer naming that output, any other a plain
  answer — so a compaction in between does not make the model ask again. A request
  ending in a `compaction_trigger` item gets a `compaction` item. `patch`: the same
  with a freeform `apply_patch` call (`custom_tool_call`, raw `input`) adding hello.txt.
  `tool-search`: the same with a `tool_search_call` to the client-run `tool_search` tool.
- `GET /v1/models` as `--models` says: `404`, `openai` (`{"object": "list", "data"}`)
  or `codex` (`{"models": [...]}`, the shape Codex's own catalog uses).
- A WebSocket upgrade on `/v1/responses` with `--upgrade` (an HTTP status: the server
  does not speak WebSocket, as a gateway without it would not).
- `POST /v1/responses` with an OpenAI-shaped error instead when `--fail STATUS` is given.
- `POST /v1/responses/compact` with 404 or, with `--compact serve`, a summary item.
- Anything else with 404 in OpenAI's error shape.

Used to write the golden recordings in tests/data/codex/ (see its README).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "openai-api-key", "cookie", "proxy-authorization"}
SHELL_TOOLS = ("exec_command", "shell_command", "shell", "local_shell")
ANSWER = "Hello from the recording server."
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the recording server\n*** End Patch\n"


def redact(headers: dict[str, str]) -> dict[str, str]:
    """Headers with credentials replaced by their scheme and length."""
    out = {}
    for name, value in headers.items():
        if name.lower() in SECRET_HEADERS:
            scheme = value.split(" ", 1)[0] + " " if " " in value else ""
            out[name] = f"{scheme}<redacted {len(value)} chars>"
        else:
            out[name] = value
    return out


class Recorder:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.counter = itertools.count(1)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

    async def record(self, request: Request, answer: int | str) -> Any:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        entry = {
            "seq": next(self.counter),
            "time": time.time(),
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": redact(dict(request.headers)),
            "body": body,
            "answer": answer,
        }
        with self.log.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")
        return body


def openai_error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}, status_code=status)


# --- the Responses stream ------------------------------------------------------------


def sse(events: list[dict[str, Any]]) -> Iterator[bytes]:
    for number, event in enumerate(events):
        yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n".encode()


def response_object(request: dict[str, Any], response_id: str, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": request.get("model"),
        "output": output,
        "parallel_tool_calls": bool(request.get("parallel_tool_calls", True)),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": usage,
    }


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def text_events(text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    item_id = f"msg_{uuid.uuid4().hex[:24]}"
    part = {"type": "output_text", "text": "", "annotations": []}
    start = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    done = {**start, "status": "completed", "content": [{**part, "text": text}]}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": start},
        {"type": "response.content_part.added", **where, "part": part},
        *({"type": "response.output_text.delta", **where, "delta": word, "logprobs": []} for word in _words(text)),
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": {**part, "text": text}},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def call_events(name: str, arguments: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    item_id = f"fc_{uuid.uuid4().hex[:24]}"
    start = {"id": item_id, "type": "function_call", "status": "in_progress", "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": name, "arguments": ""}
    done = {**start, "status": "completed", "arguments": arguments}
    half = len(arguments) // 2
    where = {"item_id": item_id, "output_index": 0}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": start},
        *({"type": "response.function_call_arguments.delta", **where, "delta": piece} for piece in (arguments[:half], arguments[half:])),
        {"type": "response.function_call_arguments.done", **where, "name": name, "arguments": arguments},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def custom_call_events(name: str, raw: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A freeform tool's call: raw `input`, never JSON arguments."""
    item_id = f"ctc_{uuid.uuid4().hex[:24]}"
    start = {"id": item_id, "type": "custom_tool_call", "status": "in_progress", "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": name, "input": ""}
    done = {**start, "status": "completed", "input": raw}
    where = {"item_id": item_id, "output_index": 0}
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": start},
        {"type": "response.custom_tool_call_input.delta", **where, "delta": raw},
        {"type": "response.custom_tool_call_input.done", **where, "input": raw},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ]
    return events, done


def search_call_events(query: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A call to a client-executed `tool_search` tool: the agent answers with the tools it found."""
    item = {"id": f"tsc_{uuid.uuid4().hex[:24]}", "type": "tool_search_call", "status": "completed", "call_id": f"call_{uuid.uuid4().hex[:24]}",
            "execution": "client", "arguments": {"query": query}}
    events = [{"type": f"response.output_item.{step}", "output_index": 0, "item": item} for step in ("added", "done")]
    return events, item


def compaction_events() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A `compaction` item, what OpenAI's server-side compaction answers a `compaction_trigger` with."""
    item = {"id": f"cmp_{uuid.uuid4().hex[:24]}", "type": "compaction", "encrypted_content": "recorder-opaque-summary"}
    events = [{"type": f"response.output_item.{step}", "output_index": 0, "item": item} for step in ("added", "done")]
    return events, item


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + words[-1:]


def shell_call(request: dict[str, Any], command: str) -> tuple[str, str] | None:
    """The offered shell tool's name and arguments asking for `command`."""
    offered = {tool.get("name"): tool for tool in request.get("tools") or [] if isinstance(tool, dict)}
    for name in SHELL_TOOLS:
        if name not in offered:
            continue
        properties = ((offered[name].get("parameters") or {}).get("properties")) or {}
        if "cmd" in properties:
            return name, json.dumps({"cmd": command})
        if properties.get("command", {}).get("type") == "array":
            return name, json.dumps({"command": ["bash", "-lc", command]})
        return name, json.dumps({"command": command})
    return None


def last_item_type(request: dict[str, Any]) -> str | None:
    items = request.get("input")
    return items[-1].get("type") if isinstance(items, list) and items and isinstance(items[-1], dict) else None


def tool_output(request: dict[str, Any]) -> str | None:
    """The output of the last tool call when the request's last item carries one."""
    items = request.get("input")
    if not isinstance(items, list) or not items:
        return None
    last = items[-1]
    if isinstance(last, dict) and last.get("type") in ("function_call_output", "custom_tool_call_output", "tool_search_output"):
        output = last.get("output", last.get("tools"))
        return output if isinstance(output, str) else json.dumps(output)
    return None


def responses_answer(request: dict[str, Any], args: argparse.Namespace, session: str, called: set[str]) -> Iterator[bytes]:
    output = tool_output(request)
    first = output is None and session not in called
    call = shell_call(request, args.command) if args.scenario == "shell" and first else None
    patch = args.scenario == "patch" and first and any(isinstance(t, dict) and t.get("name") == "apply_patch" for t in request.get("tools") or [])
    if last_item_type(request) == "compaction_trigger":
        events, item = compaction_events()
    elif call is not None:
        called.add(session)
        events, item = call_events(*call)
    elif patch:
        called.add(session)
        events, item = custom_call_events("apply_patch", PATCH)
    elif args.scenario == "tool-search" and first and any(isinstance(t, dict) and t.get("type") == "tool_search" for t in request.get("tools") or []):
        called.add(session)
        events, item = search_call_events("spawn a sub-agent")
    elif output is not None:
        events, item = text_events(f"The tool returned: {(output.strip().splitlines() or ['(nothing)'])[-1][:200]}")
    else:
        events, item = text_events(ANSWER)
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    opened = response_object(request, response_id, "in_progress", [], None)
    closed = response_object(request, response_id, "completed", [item], usage(args.input_tokens, 12))
    stream = [{"type": "response.created", "response": opened}, {"type": "response.in_progress", "response": opened}, *events]
    stream.append({"type": "response.completed", "response": closed})
    return sse(stream)


# --- routes ----------------------------------------------------------------------------


def build_app(args: argparse.Namespace, recorder: Recorder) -> Starlette:
    called: set[str] = set()  # sessions whose model already asked for the command

    async def responses(request: Request) -> Response:
        if request.headers.get("upgrade", "").lower() == "websocket":
            await recorder.record(request, args.upgrade)
            return openai_error(args.upgrade, "WebSocket is not served here", "websocket_unsupported")
        if request.method != "POST":
            await recorder.record(request, 405)
            return openai_error(405, "use POST", "method_not_allowed")
        if args.fail:
            await recorder.record(request, args.fail)
            return openai_error(args.fail, f"refused with {args.fail} by the recording server", "recorder_refusal")
        body = await recorder.record(request, "stream")
        if not isinstance(body, dict):
            return openai_error(400, "expected a JSON object", "invalid_request")

        async def chunks() -> AsyncIterator[bytes]:
            session = request.headers.get("session-id") or str(body.get("prompt_cache_key"))
            for chunk in responses_answer(body, args, session, called):
                yield chunk
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def compact(request: Request) -> Response:
        if args.compact == "404":
            await recorder.record(request, 404)
            return openai_error(404, "no route /v1/responses/compact", "unknown_route")
        await recorder.record(request, 200)
        summary = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summary: the user asked for a shell command; it ran."}]}
        return JSONResponse({"output": [summary]})

    async def models(request: Request) -> Response:
        await recorder.record(request, 404 if args.models == "404" else 200)
        if args.models == "404":
            return openai_error(404, "no route /v1/models", "unknown_route")
        if args.models == "openai":
            return JSONResponse({"object": "list", "data": [{"id": args.model, "object": "model", "created": 0, "owned_by": "recorder"}]})
        return JSONResponse({"models": []})

    async def anything(request: Request) -> Response:
        await recorder.record(request, 404)
        return openai_error(404, f"no route {request.url.path}", "unknown_route")

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[
        Route("/v1/responses", responses, methods=methods),
        Route("/v1/responses/compact", compact, methods=methods),
        Route("/v1/models", models, methods=["GET"]),
        Route("/{path:path}", anything, methods=methods),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, one per request (overwritten)")
    parser.add_argument("--scenario", choices=("text", "shell", "patch", "tool-search"), default="text")
    parser.add_argument("--command", default="echo portcullis-tool-ok", help="the shell command the shell scenario asks for")
    parser.add_argument("--models", choices=("404", "openai", "codex"), default="404")
    parser.add_argument("--model", default="gpt-5.5", help="the model id /v1/models lists")
    parser.add_argument("--upgrade", type=int, default=426, help="the status a WebSocket upgrade gets")
    parser.add_argument("--compact", choices=("404", "serve"), default="404")
    parser.add_argument("--fail", type=int, default=0, help="answer every POST /v1/responses with this status, in OpenAI's error shape")
    parser.add_argument("--input-tokens", type=int, default=100, help="input_tokens each answer reports (large values provoke compaction)")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", args.port))
        port = sock.getsockname()[1]
    print(f"record_client: listening on http://127.0.0.1:{port}", flush=True)
    # ws="none": an upgrade reaches the app as plain HTTP, as it would a server without WebSocket.
    uvicorn.run(build_app(args, Recorder(args.log)), host="127.0.0.1", port=port, ws="none", log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
