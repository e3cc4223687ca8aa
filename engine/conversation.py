"""A request seen as a conversation: its system texts, the tools it offers, its first
message and how many turns it has had. Every protocol's surfaces build one, so what the
routing layers read of a request — intent features, the key that keeps a conversation
on one pod or one cache domain, the session a tier is pinned to — is computed once,
the same way, whatever protocol the client speaks.

The prefix key hashes only what stays the same from the first turn on: the team, the
tools, the first ``system_blocks`` system texts and the first message. (The seed's
``messages[0..2]`` would move a conversation between its first and second turns: the
first turn has one message.) Texts are hashed, never kept."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Conversation:
    system: tuple[str, ...] = ()  # the system / developer / instructions texts, in order
    first_message: tuple[str, ...] = ()  # the texts of the first non-system message
    first_user_texts: tuple[str, ...] = ()  # the task as asked: the first user message's texts, less the agent's context
    turns: int = 0  # user messages so far (a tool result counts: it is a turn of an agent's loop)
    messages: int = 0  # every non-system message
    reasoning: bool = False  # the client asked for extended thinking / reasoning


EMPTY = Conversation()
# The system texts that name a session: the agent's own prompt. Agents put per-turn
# context (a date, the working directory, git status) in later blocks.
SESSION_SYSTEM_BLOCKS = 1


def prefix_key(team: str, tools: list[str], conversation: Conversation, system_blocks: int) -> str:
    """A stable 128-bit hex key for a conversation's prefix, scoped to the team."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (team, *tools, "\x1e", *conversation.system[:system_blocks], "\x1e", *conversation.first_message):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x1f")  # a separator no text carries: ("ab", "c") and ("a", "bc") differ
    return digest.hexdigest()


def session_key(team: str, user: str | None, client_session: str | None, prefix: str) -> str:
    """The session a conversation belongs to: the client's own id when it sends one
    (``x-portcullis-session-id``, Claude Code's), else its prefix key; scoped to the
    principal, so one team's session id never names another's state."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (team, user or "", client_session or "", "" if client_session else prefix):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x1f")
    return digest.hexdigest()


# A text that is one element and nothing else, named as agents name their context
# (`<system-reminder>…</system-reminder>`, `<environment_context>…</environment_context>`,
# a compound name: never an HTML tag): what a coding agent puts beside the user's ask in
# the same message, not the ask itself.
_CONTEXT_BLOCK = re.compile(r"\s*<([a-z][a-z0-9]*[-_][a-z0-9_-]{0,62})(?:\s[^>]*)?>.*</\1>\s*", re.DOTALL)


def task_texts(texts: tuple[str, ...]) -> tuple[str, ...]:
    """The user's ask among a message's texts: the agent's context blocks left out (all
    of them, when nothing else is there: then they are the ask)."""
    asked = tuple(text for text in texts if not _CONTEXT_BLOCK.fullmatch(text))
    return asked or texts


def conversation_of(system: list[str], messages: list[tuple[str, tuple[str, ...]]], reasoning: bool = False) -> Conversation:
    """Built from a protocol's system texts and its messages as (role, texts), role one
    of ``user``, ``assistant`` or ``tool`` (a tool's result sent back)."""
    first_user = task_texts(next((texts for role, texts in messages if role == "user"), ()))
    return Conversation(
        system=tuple(system),
        first_message=messages[0][1] if messages else (),
        first_user_texts=first_user,
        turns=sum(1 for role, _ in messages if role != "assistant"),
        messages=len(messages),
        reasoning=reasoning,
    )


def texts_of(content: object, text_types: frozenset[str]) -> tuple[str, ...]:
    """The texts of a message's content: a string, or the ``text`` of each block whose
    ``type`` is one of ``text_types`` (a block without a type counts when it has text)."""
    if isinstance(content, str):
        return (content,)
    if not isinstance(content, list):
        return ()
    texts = []
    for block in content:
        if isinstance(block, dict) and isinstance(block.get("text"), str) and block.get("type", "text") in text_types:
            texts.append(block["text"])
    return tuple(texts)


def asks_reasoning(options: object, key: str, off: tuple[str, ...]) -> bool:
    """Whether a request's reasoning options (``thinking``, ``reasoning``…) turn it on:
    present, and ``key`` (its type or effort) not one of the values meaning off."""
    return isinstance(options, dict) and options.get(key) not in off
