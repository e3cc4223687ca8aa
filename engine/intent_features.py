"""What the intent router (routing layer L4) reads of a request: a few coarse numbers
and names computed from its ``Conversation`` and its parse, never its text.

Computed at decision time, before any step transforms the request, so every figure is
of the request as the client sent it:

- ``input_tokens``: estimated from the body's size (4 bytes a token, JSON and tool
  schemas included), rounded down to a power of two. It is not the count governance
  sizes a reservation by (that comes later, of the transformed body): a cheap estimate,
  so a router can tell a short ask from a long context.
- ``tools``: how many tools the request offers; ``turns``: user turns so far (a tool
  result counts), ``first_turn`` when it is 1 or less; ``reasoning``: the client asked
  for extended thinking / reasoning; ``client``: a name from ``engine.clients``.
- the task: the first user message's texts (what was asked, the same on every turn of
  the conversation): ``text_chars`` (their length), ``code`` (a fenced block, or at
  least ``CODE_LINES`` lines that look like code) and ``keywords`` (the names of the
  bundle's keyword sets they match).

Work is bounded: only the first ``MAX_CHARS`` characters of the task are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import re2

from portcullis.engine.conversation import Conversation
from portcullis.engine.intent_keywords import MAX_CHARS, KeywordMatcher

BYTES_PER_TOKEN = 4
CODE_LINES = 2  # lines that look like code, for a text without a fenced block
_FENCE = re2.compile(r"(?m)^\s*(```|~~~)")
# A line that reads as code in the languages agents are asked about: a keyword that
# opens a definition or an import, a statement ending in ; { or }, an assignment or call.
_CODE_LINE = re2.compile(
    r"(?m)^[ \t]*(?:"
    r"(?:def|class|import|from|return|function|const|let|var|func|fn|pub|package|public|private|static|struct|impl|#include|SELECT|INSERT|UPDATE|CREATE|ALTER)\b[^\n]*"
    r"|[^\n]*[;{}][ \t]*$"
    r"|[A-Za-z_][\w.\[\]]*[ \t]*(?:=|\+=|:=)[ \t]*[^\n=]+"
    r"|[A-Za-z_][\w.]*\([^\n]*\)[ \t]*:?[ \t]*$"
    r")"
)


def bucket(value: int) -> int:
    """``value`` rounded down to a power of two (0 stays 0): coarse, so equal-looking
    requests share one cached decision."""
    return 0 if value <= 0 else 1 << (value.bit_length() - 1)


def has_code(texts: Sequence[str]) -> bool:
    text = "\n".join(texts)[:MAX_CHARS]
    if _FENCE.search(text):
        return True
    return sum(1 for _ in _CODE_LINE.finditer(text)) >= CODE_LINES


def features_of(conversation: Conversation, tools: int, body_bytes: int, client: str, keywords: KeywordMatcher) -> dict[str, Any]:
    """``input.facts.features`` for one request."""
    task = conversation.first_user_texts
    return {
        "input_tokens": bucket(body_bytes // BYTES_PER_TOKEN),
        "tools": tools,
        "turns": conversation.turns,
        "first_turn": conversation.turns <= 1,
        "reasoning": conversation.reasoning,
        "client": client,
        "text_chars": sum(len(text) for text in task),
        "code": has_code(task),
        "keywords": keywords.matched(task),
    }
