"""Restoring in streams, event by event, in both providers' protocols; and the vault,
in memory and in real Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis

from portcullis.adapters.pii.guard import PiiState
from portcullis.adapters.pii.restoring import Restorer
from portcullis.adapters.pii.vault import PSEUDONYM, TOKEN, MemoryVault, RedisVault, scope_id, vault_key
from portcullis.adapters.protocols.anthropic_messages import PROTOCOL as anthropic_messages
from portcullis.adapters.protocols.openai_chat import PROTOCOL as openai_chat
from portcullis.adapters.protocols.sse import SSEEvent, SSEParser, encode
from portcullis.engine.errors import GatewayError
from portcullis.engine.pii.policy import PiiPolicy
from tests.conftest import Services

POLICY = PiiPolicy(
    ("p",), {"EMAIL": "pseudonymize", "PERSON": "pseudonymize", "IBAN": "tokenize"}, ("patterns",), 0.6, frozenset({"text"}), "block", "fail_closed", False
)


def anthropic_text(index: int, text: str) -> SSEEvent:
    return _event({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}, "content_block_delta")


def anthropic_json(index: int, partial: str) -> SSEEvent:
    return _event({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}, "content_block_delta")


def anthropic_stop(index: int) -> SSEEvent:
    return _event({"type": "content_block_stop", "index": index}, "content_block_stop")


def chat_chunk(content: str | None = None, arguments: str | None = None, finish: str | None = None) -> SSEEvent:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if arguments is not None:
        delta["tool_calls"] = [{"index": 0, "function": {"arguments": arguments}}]
    return _event({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _event(document: dict[str, Any], name: str | None = None) -> SSEEvent:
    [event] = SSEParser().feed(encode(document, name))
    return event


def run(restorer: Restorer, batches: list[list[SSEEvent]]) -> list[list[SSEEvent]]:
    """What comes out after each batch, then at the end."""

    async def go() -> list[list[SSEEvent]]:
        out = [await restorer.events(batch) for batch in batches]
        return [*out, await restorer.finish()]

    return asyncio.run(go())


def texts(outputs: list[list[SSEEvent]], protocol: Any) -> str:
    return "".join(piece.holder[piece.key] for batch in outputs for event in batch for piece in protocol.surfaces.stream_texts(event.json()))


def restorer(protocol: Any, known: dict[str, str] | None = None, **state: Any) -> Restorer:
    return Restorer(PiiState(POLICY, dict(known or {"<EMAIL_1>": "ann@example.com"}), **state), MemoryVault(), protocol)


def test_a_placeholder_split_over_three_events_is_restored_and_held_only_that_long() -> None:
    batches = [[anthropic_text(0, "Mail <EM")], [anthropic_text(0, "AIL")], [anthropic_text(0, "_1> today")], [anthropic_stop(0)]]
    outputs = run(restorer(anthropic_messages), batches)
    assert [len(batch) for batch in outputs] == [0, 1, 2, 1, 0]  # each delta waits for the next only
    assert texts(outputs, anthropic_messages) == "Mail ann@example.com today"


def test_a_tail_that_never_becomes_a_placeholder_goes_back_when_its_block_ends() -> None:
    outputs = run(restorer(anthropic_messages), [[anthropic_text(0, "x <B")], [anthropic_stop(0), anthropic_text(1, "next")]])
    assert texts(outputs, anthropic_messages) == "x <Bnext"
    assert [e.event for batch in outputs for e in batch] == ["content_block_delta", "content_block_stop", "content_block_delta"]


def test_values_restored_inside_streamed_tool_input_are_escaped_for_json() -> None:
    known = {"<PERSON_1>": 'Ann "Nan" Lee'}
    batches = [[anthropic_json(1, '{"name": "<PER')], [anthropic_json(1, 'SON_1>"}')], [anthropic_stop(1)]]
    outputs = run(restorer(anthropic_messages, known), batches)
    assert json.loads(texts(outputs, anthropic_messages)) == {"name": 'Ann "Nan" Lee'}


def test_openai_content_and_tool_arguments_are_separate_channels() -> None:
    batches = [[chat_chunk(content="to <EMA")], [chat_chunk(arguments='{"to": "<EMAIL_1')], [chat_chunk(content="IL_1>")], [chat_chunk(arguments='>"}')]]
    outputs = run(restorer(openai_chat), [*batches, [chat_chunk(finish="tool_calls")]])
    pieces = [(p.key, p.holder[p.key]) for batch in outputs for e in batch for p in openai_chat.surfaces.stream_texts(e.json())]
    assert "".join(v for k, v in pieces if k == "content") == "to ann@example.com"
    assert json.loads("".join(v for k, v in pieces if k == "arguments")) == {"to": "ann@example.com"}


def test_events_without_placeholders_pass_through_untouched() -> None:
    event = anthropic_text(0, "plain <b>html</b>")
    outputs = run(restorer(anthropic_messages), [[event], [anthropic_stop(0)]])
    assert outputs[0] == [event] and outputs[0][0].raw is event.raw


def test_a_placeholder_nobody_can_restore_ends_the_stream() -> None:
    with pytest.raises(GatewayError) as withheld:
        run(restorer(anthropic_messages, {}), [[anthropic_text(0, "hi <EMAIL_7>")]])
    assert withheld.value.code == "pii_restore_failed"


def test_tokens_stay_tokens_for_principals_who_may_not_read_them() -> None:
    outputs = run(restorer(anthropic_messages, {}), [[anthropic_text(0, "iban <IBAN_TKN_0123456789>")], [anthropic_stop(0)]])
    assert texts(outputs, anthropic_messages) == "iban <IBAN_TKN_0123456789>"


def test_choices_of_one_stream_are_restored_apart() -> None:
    def chunk(index: int, content: str | None = None, finish: str | None = None) -> SSEEvent:
        delta = {"content": content} if content is not None else {}
        return _event({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})

    batches = [[chunk(0, "a <EMA"), chunk(1, "b <EMA")], [chunk(0, finish="stop")], [chunk(1, "IL_1>")], [chunk(1, finish="stop")]]
    outputs = run(restorer(openai_chat), batches)
    by_choice: dict[int, str] = {}
    for batch in outputs:
        for event in batch:
            for choice in event.json()["choices"]:
                by_choice[choice["index"]] = by_choice.get(choice["index"], "") + (choice["delta"].get("content") or "")
    assert by_choice == {0: "a <EMA", 1: "b ann@example.com"}  # choice 0 ending does not close choice 1


def test_placeholders_written_with_html_safe_escapes_are_restored() -> None:
    batches = [[anthropic_json(1, '{"to": "\\u003cEMAIL_1\\u00')], [anthropic_json(1, '3e"}')], [anthropic_stop(1)]]
    outputs = run(restorer(anthropic_messages), batches)
    assert json.loads(texts(outputs, anthropic_messages)) == {"to": "ann@example.com"}


def test_nothing_that_holds_values_shows_them_in_a_repr() -> None:
    state = PiiState(POLICY, {"<EMAIL_1>": "ann@example.com"})
    restoring = restorer(anthropic_messages)
    run(restoring, [[anthropic_text(0, "x <EMAIL_1> <EM")]])
    assert "ann@example.com" not in repr(state) + repr(restoring)


# --- the vault ------------------------------------------------------------------------------


def test_memory_vault_numbers_per_scope_and_reveals_only_its_own() -> None:
    async def go() -> None:
        vault = MemoryVault()
        first = await vault.assign("a", PSEUDONYM, [("EMAIL", "x@example.com"), ("EMAIL", "y@example.com")], 60)
        again = await vault.assign("a", PSEUDONYM, [("EMAIL", "y@example.com"), ("EMAIL", "z@example.com")], 60)
        assert (first, again) == (["<EMAIL_1>", "<EMAIL_2>"], ["<EMAIL_2>", "<EMAIL_3>"])
        assert await vault.assign("b", PSEUDONYM, [("EMAIL", "z@example.com")], 60) == ["<EMAIL_1>"]
        assert await vault.reveal("a", ["<EMAIL_3>", "<EMAIL_9>"]) == {"<EMAIL_3>": "z@example.com"}
        assert await vault.reveal("b", ["<EMAIL_2>"]) == {}

    asyncio.run(go())


def test_memory_vault_forgets_expired_and_least_recent_scopes() -> None:
    now = [0.0]

    async def go() -> None:
        vault = MemoryVault(max_scopes=2, clock=lambda: now[0])
        for scope in ("a", "b"):
            await vault.assign(scope, PSEUDONYM, [("EMAIL", "x@example.com")], 60)
        await vault.assign("c", PSEUDONYM, [("EMAIL", "x@example.com")], 60)
        assert await vault.reveal("a", ["<EMAIL_1>"]) == {}  # evicted: least recently used
        now[0] = 61
        assert await vault.reveal("c", ["<EMAIL_1>"]) == {}  # expired

    asyncio.run(go())


def test_redis_vault_is_shared_atomic_and_sealed_to_its_scope(services: Services) -> None:
    key = vault_key("00" * 32)

    async def go() -> None:
        redis = Redis.from_url(services.redis_url)
        vault = RedisVault(redis, services.redis_prefix, key)
        scope, other = scope_id("session", "eng", "user:alice", "s1"), scope_id("session", "eng", "user:bob", "s1")
        values = [("EMAIL", f"user{i}@example.com") for i in range(20)]
        results = await asyncio.gather(*(vault.assign(scope, PSEUDONYM, values, 60) for _ in range(8)))
        assert all(r == results[0] for r in results) and sorted(results[0]) == sorted(f"<EMAIL_{i}>" for i in range(1, 21))
        assert await vault.reveal(scope, ["<EMAIL_3>"]) == {"<EMAIL_3>": "user2@example.com"}
        [token] = await vault.assign(scope_id("tokens", "eng"), TOKEN, [("IBAN", "DE89370400440532013000")], 60)
        assert token.startswith("<IBAN_TKN_") and await vault.reveal(scope_id("tokens", "eng"), [token]) == {token: "DE89370400440532013000"}
        stored = {k: await redis.get(k) for k in await redis.keys(f"{services.redis_prefix}vault:{{{scope}}}:*")}
        assert stored and not any(b"example.com" in k or b"example.com" in v for k, v in stored.items())  # HMAC'd lookups, sealed values
        assert all(0 < ttl <= 60 for ttl in [await redis.ttl(k) for k in stored])  # every mapping expires on its own
        first, second = f"{services.redis_prefix}vault:{{{scope}}}:r:<EMAIL_1>", f"{services.redis_prefix}vault:{{{scope}}}:r:<EMAIL_2>"
        # Sealed values bound to scope and placeholder: copied to another session, or
        # swapped between placeholders, they do not open.
        await redis.set(f"{services.redis_prefix}vault:{{{other}}}:r:<EMAIL_1>", stored[first.encode()])
        assert await vault.reveal(other, ["<EMAIL_1>"]) == {}
        await redis.set(second, stored[first.encode()])
        assert await vault.reveal(scope, ["<EMAIL_1>", "<EMAIL_2>"]) == {"<EMAIL_1>": "user0@example.com"}
        assert await RedisVault(redis, services.redis_prefix, None).reveal(scope, ["<EMAIL_1>"]) == {}  # sealed: no key, no value
        await redis.aclose()

    asyncio.run(go())
