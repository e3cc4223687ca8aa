"""The built-in offline provider: answers in whichever protocol it is addressed in,
streaming included, with plausible usage; asked in so many words to run a shell command
with a shell tool on offer, it answers with a call to that tool (see shell_call). For
quickstarts, demos and the agents check; tests use the faithful fake provider under
tests/ instead."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.protocols.anthropic_messages import count_tokens
from portcullis.adapters.protocols.anthropic_messages import wire as messages_wire
from portcullis.adapters.protocols.openai_chat import wire as chat_wire
from portcullis.adapters.protocols.openai_responses import wire as responses_wire
from portcullis.adapters.providers.mock import chat, messages, responses
from portcullis.adapters.providers.mock.answer import MockResponse
from portcullis.adapters.providers.mock.shell_call import shell_call

__all__ = ["MockProvider", "MockResponse"]

ANSWERS = {messages_wire.UPSTREAM_PATH: messages.answer, chat_wire.UPSTREAM_PATH: chat.answer, responses_wire.UPSTREAM_PATH: responses.answer}


class MockProvider:
    protocol = None

    def __init__(self, name: str) -> None:
        self.name = name

    def protocol_for(self, model: str, client: str | None) -> str | None:
        return None  # whichever the client speaks

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> MockResponse:
        request = json.loads(body)
        words = _reply(request).split(" ")
        words = [w + " " for w in words[:-1]] + words[-1:]
        input_tokens = max(1, len(body) // 4)
        if path == count_tokens.PATH:
            return MockResponse(200, "application/json", [json.dumps({"input_tokens": input_tokens}).encode()])
        answer = ANSWERS.get(path)
        if answer is not None:
            return answer(request, words, input_tokens, shell_call(path, request))
        return MockResponse(404, "application/json", [b'{"error": {"message": "unknown path"}}'])

    async def close(self) -> None:
        return None


def _reply(request: Mapping[str, Any]) -> str:
    turns = request.get("input")
    count = len(request.get("messages") or []) if turns is None else (1 if isinstance(turns, str) else len(turns))
    return f"Hello from the Portcullis mock provider. You sent {count} message{'s' if count != 1 else ''} to {request.get('model')}."
