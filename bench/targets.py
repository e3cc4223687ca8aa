"""What the headline benchmark loads: a target (a URL, and the process behind it when
the bench started one) and the requests it answers, one per scenario, as that target
receives them (the gateway's model and key, or the upstream's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import verdict

CHAT = [{"role": "user", "content": "Summarise the quarterly report in three bullet points."}]


@dataclass(frozen=True)
class Request:
    """One scenario as a target receives it."""

    scenario: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def streams(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass
class Target:
    """Something wrk loads: its URL, the requests it answers, and its process (if ours)."""

    name: str
    url: str
    requests: list[Request]
    workers: str = "-"
    processes: int = 1
    pid: int | None = None
    notes: list[str] = field(default_factory=list)


def chat_requests(model: str, headers: dict[str, str], messages_model: str | None = None, messages_headers: dict[str, str] | None = None) -> list[Request]:
    """Chat completions, streamed and not; Messages too when a model and headers are given."""
    chat = {"model": model, "messages": CHAT, "max_tokens": 64}
    requests = [
        Request(verdict.CHAT, "/v1/chat/completions", chat, headers),
        Request(verdict.CHAT_STREAM, "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}, headers),
    ]
    if messages_model and messages_headers:
        messages = {"model": messages_model, "messages": CHAT, "max_tokens": 64}
        requests += [
            Request("messages", "/v1/messages", messages, messages_headers),
            Request("messages stream", "/v1/messages", {**messages, "stream": True}, messages_headers),
        ]
    return requests
