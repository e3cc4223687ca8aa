"""A request of the size Claude Code sends mid-task, for benchmarks of what the gateway
computes from a request's content: a long system prompt in two blocks, 17 tools with
JSON schemas, a first user message with its reminders, and a dozen turns of tool calls
and results (about 60 KiB), parsed by the Anthropic Messages ingress as served."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from portcullis.adapters.auth import Principal
from portcullis.adapters.ingress import session_of
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.protocols import anthropic_messages
from portcullis.adapters.protocols.anthropic_messages import wire
from portcullis.engine.clients import client_of

MODEL = "claude-m0"  # a model an intent router of the generated bundle covers for every team
TEAM = "team0"
HEADERS = {
    "user-agent": "claude-cli/2.1.197 (external, cli)",
    "x-claude-code-session-id": "0d9c1a52-5d1e-4c59-a3e4-bench00000001",
    "anthropic-version": "2023-06-01",
}
_PARAGRAPH = (
    "You are an interactive CLI tool that helps users with software engineering tasks. Use the instructions below and the tools "
    "available to you to assist the user. Keep responses concise; prefer editing existing files to creating new ones; never commit "
    "unless asked. When you run a non-trivial command, explain what it does and why. "
)
_TOOLS = [
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "LS",
    "ExitPlanMode",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
    "KillShell",
    "SlashCommand",
]


def _tool(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name}: " + _PARAGRAPH * 2,
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command or path to act on."},
                "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)."},
                "description": {"type": "string", "description": "Clear, concise description of what this does in 5-10 words."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    }


def body() -> dict[str, Any]:
    task = "The checkout service double charges some customers when the payment webhook is retried; find the root cause and fix it."
    reminder = "<system-reminder>As you answer the user's questions, you can use the following context: " + _PARAGRAPH * 6 + "</system-reminder>"
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": task}]}]
    for turn in range(12):
        call = {"type": "tool_use", "id": f"toolu_{turn:04d}", "name": "Read", "input": {"command": f"services/checkout/handler_{turn}.py"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Let me read the handler."}, call]})
        source = "def handle(event):\n    payment = load(event.id)\n    if payment.state == 'pending':\n        charge(payment)\n" * 12
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": source}]})
    system = [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": _PARAGRAPH * 40, "cache_control": {"type": "ephemeral"}},
    ]
    return {"model": MODEL, "max_tokens": 32000, "system": system, "tools": [_tool(name) for name in _TOOLS], "messages": messages, "stream": True}


RAW = json.dumps(body()).encode()


def claude_code_exchange(bundle: Any, team: str = TEAM) -> Exchange:
    """A fresh exchange (nothing computed of it yet) for the request, on ``bundle``."""
    request = wire.parse(RAW, HEADERS)
    request.session, request.client = session_of(HEADERS), client_of(HEADERS["user-agent"])  # as the executor sets them
    exchange = Exchange("bench", anthropic_messages.PROTOCOL, time.monotonic(), dt.datetime.now(dt.UTC))
    exchange.principal, exchange.request, exchange.bundle = Principal("bench", team, f"user{team[4:]}-1"), request, bundle
    return exchange
