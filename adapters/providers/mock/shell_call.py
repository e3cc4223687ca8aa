"""When the mock provider asks for a shell command instead of answering text.

Only when the request's last turn is the user asking, in these words, for a command and
the request offers a shell tool: the turn that carries the command's result gets text,
and the prompt left in the history does not ask again."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from portcullis.adapters.protocols.anthropic_messages import wire as messages_wire
from portcullis.adapters.protocols.openai_chat import wire as chat_wire
from portcullis.adapters.protocols.openai_responses import wire as responses_wire

COMMAND = re.compile(r"Run the shell command `([^`]+)`")
# The shell tools agents offer, most specific first, and the argument each takes the command in.
SHELL_TOOLS = {"exec_command": "cmd", "shell_command": "command", "shell": "command", "Bash": "command", "bash": "command"}


@dataclass(frozen=True)
class ShellCall:
    name: str
    arguments: str  # a JSON object, as the protocols carry a call's arguments

    def pieces(self) -> list[str]:
        """The arguments in a few pieces, as a stream delivers them."""
        step = max(1, len(self.arguments) // 3)
        return [self.arguments[at:at + step] for at in range(0, len(self.arguments), step)]


def shell_call(path: str, request: Mapping[str, Any]) -> ShellCall | None:
    """The call the mock provider answers this request with, None for a text answer."""
    if path == messages_wire.UPSTREAM_PATH:
        text, tools = _messages_prompt(request), [tool.get("name") for tool in _dicts(request.get("tools"))]
    elif path == chat_wire.UPSTREAM_PATH:
        text, tools = _chat_prompt(request), [(tool.get("function") or {}).get("name") for tool in _dicts(request.get("tools"))]
    elif path == responses_wire.UPSTREAM_PATH:
        text, tools = _responses_prompt(request), [tool.get("name") for tool in _dicts(request.get("tools")) if tool.get("type") == "function"]
    else:
        return None
    asked = COMMAND.search(text or "")
    name = next((name for name in SHELL_TOOLS if name in tools), None)
    if asked is None or name is None:
        return None
    return ShellCall(name, json.dumps({SHELL_TOOLS[name]: asked.group(1)}))


def _messages_prompt(request: Mapping[str, Any]) -> str | None:
    messages = _dicts(request.get("messages"))
    if not messages or messages[-1].get("role") != "user":
        return None
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    blocks = _dicts(content)
    if any(block.get("type") == "tool_result" for block in blocks):
        return None
    return "\n".join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")


def _chat_prompt(request: Mapping[str, Any]) -> str | None:
    messages = _dicts(request.get("messages"))
    if not messages or messages[-1].get("role") != "user":
        return None  # a `tool` message carries a call's result
    return _text(messages[-1].get("content"), "text")


def _responses_prompt(request: Mapping[str, Any]) -> str | None:
    turns = request.get("input")
    if isinstance(turns, str):
        return turns
    items = _dicts(turns)
    if not items:
        return None
    last = items[-1]
    # A message item may leave out its type; a `function_call_output` carries a call's result.
    if last.get("type", "message") != "message" or last.get("role") != "user":
        return None
    return _text(last.get("content"), "input_text")


def _text(content: Any, part_type: str) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in _dicts(content) if part.get("type") == part_type)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
