"""The PII guard's sessions and vault end to end: stable pseudonyms and prefixes, who
may restore what, a lost or unreachable vault, replicas sharing a Redis vault."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anthropic
import pytest

from tests.conftest import Fakes, Services, private_redis
from tests.fakes import Reply
from tests.pii_helpers import CARD, EMAIL, IBAN, OTHER_EMAIL, REGULATED, SONNET_UPSTREAM, claude, pii_bundle, received

pytestmark = pytest.mark.served


# --- sessions, scopes and the vault ---------------------------------------------------------


def test_session_pseudonyms_keep_the_upstream_prefix_byte_stable(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Cache honesty: with a session, turn 2's upstream body begins with turn 1's bytes
    (less the closing brackets), and a value dropped from the context keeps its number."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"), **{"x-portcullis-session-id": "conv-1"})
    system = f"You help {OTHER_EMAIL}'s team."
    turn1 = [{"role": "user", "content": f"Mail {EMAIL} the card {CARD} summary"}]
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=system, messages=turn1)
    turn2 = [*turn1, {"role": "assistant", "content": "Sent."}, {"role": "user", "content": f"Also cc {OTHER_EMAIL} and {EMAIL}"}]
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=system, messages=turn2)
    first, second = (r.body for r in fakes.anthropic_us.received)
    shared = first[: first.index(b'"}]') + 2]  # up to the end of turn 1's last message
    assert second.startswith(shared)
    assert json.loads(second)["messages"][2]["content"] == "Also cc <EMAIL_1> and <EMAIL_2>"
    compacted = [{"role": "user", "content": f"Only {EMAIL} now"}]  # turn 1 summarised away
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system="You help.", messages=compacted)
    assert fakes.anthropic_us.received[2].json["messages"][0]["content"] == "Only <EMAIL_2> now"


def test_without_a_session_numbering_follows_the_prompt(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    client = claude(gateway, gateway.key("eng"))
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{OTHER_EMAIL} then {EMAIL}"}])
    client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{EMAIL} alone"}])
    assert [r.json["messages"][0]["content"] for r in fakes.anthropic_us.received] == ["<EMAIL_1> then <EMAIL_2>", "<EMAIL_1> alone"]


def test_one_principal_never_restores_another_principals_values(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    session = {"x-portcullis-session-id": "shared-name"}
    alice, bob = claude(gateway, gateway.key("eng", "alice"), **session), claude(gateway, gateway.key("eng", "bob"), **session)
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="ok"), Reply(text="Your contact is <EMAIL_1>."), Reply(text="Your contact is <EMAIL_1>."))
    alice.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"remember {EMAIL}"}])
    with pytest.raises(anthropic.APIStatusError) as withheld:  # same session name, another principal: not Alice's vault
        bob.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "who is <EMAIL_1>?"}])
    assert withheld.value.status_code == 502 and "withheld" in withheld.value.body["error"]["message"]
    answer = alice.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "who was it?"}])
    assert answer.content[0].text == f"Your contact is {EMAIL}."  # her session's vault still knows


def test_a_lost_vault_withholds_the_answer(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Embedded, the vault is in memory: after a restart a placeholder from an earlier
    turn cannot be restored, and the answer is withheld rather than shown wrong."""
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    key = gateway.key("eng")
    session = {"x-portcullis-session-id": "conv-9"}
    claude(gateway, key, **session).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"hi {EMAIL}"}])
    gateway.stop()
    gateway.start()
    fakes.anthropic_us.script(SONNET_UPSTREAM, *[Reply(text="Reply to <EMAIL_1>.", pieces=5)] * 2)
    with pytest.raises(anthropic.APIStatusError) as withheld:
        claude(gateway, key, **session).messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "and?"}])
    assert withheld.value.body["error"]["type"] == "api_error" and "withheld" in withheld.value.body["error"]["message"]
    shown: list[str] = []
    with (
        pytest.raises(anthropic.APIError),
        claude(gateway, key, **session).messages.stream(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "and?"}]) as stream,
    ):
        shown.extend(event.delta.text for event in stream if event.type == "content_block_delta")
    assert "Reply to ".startswith("".join(shown)) and "<" not in "".join(shown)  # the stream ends in an error before the placeholder
    failed = [r for r in gateway.settled() if r["event"] == "request_failed"]
    assert [r["error"]["code"] for r in failed] == ["pii_restore_failed", "pii_restore_failed"]
    # The provider's work is still charged: the whole answer's usage, or the stream's bound
    # kept pending when the guard stopped it before its usage arrived. Never released.
    assert failed[0]["settlement"] == "settled" and failed[1]["settlement"] in ("settled", "pending")


def test_tokens_are_restored_only_for_readers(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    claude(gateway, gateway.key("eng", "alice")).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"pay {IBAN}"}]
    )
    token = fakes.anthropic_us.received[0].json["messages"][0]["content"].removeprefix("pay ")
    assert token.startswith("<IBAN_TKN_") and IBAN not in fakes.anthropic_us.received[0].body.decode()
    answer = Reply(text=f"The account is {token}.")
    fakes.anthropic_eu.script("claude-haiku-4-5-20251001", answer)  # carol may only use haiku
    fakes.anthropic_us.script(SONNET_UPSTREAM, answer)
    ask = {"max_tokens": 10, "messages": [{"role": "user", "content": "which?"}]}
    carol = claude(gateway, gateway.key("eng", "carol")).messages.create(model="claude-haiku-4-5", **ask)
    erin = claude(gateway, gateway.key("eng", "erin")).messages.create(model="claude-sonnet-4-5", **ask)
    assert carol.content[0].text == f"The account is {IBAN}."  # a reader, in another session: the team's vault
    assert erin.content[0].text == f"The account is {token}."  # not a reader: the token stays a token


# --- failures ----------------------------------------------------------------------------------


def test_a_vault_that_cannot_be_reached_refuses_or_degrades_as_the_policy_says(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": f"mail {EMAIL}"}]}
    session = {"x-portcullis-session-id": "s1"}
    with private_redis() as redis_url:
        env = {"DATABASE_URL": services.database_url, "REDIS_URL": redis_url}
        shared = {"store": {"kind": "shared", "redis_prefix": services.redis_prefix}, "auth": {"key_cache_seconds": 300}}
        closed = fresh_gateway(bundle=pii_bundle(tmp_path / "closed"), env=env, **shared)
        fail_open = {"regulated": {**REGULATED, "on_error": "fail_open"}}
        opened = fresh_gateway(bundle=pii_bundle(tmp_path / "open", fail_open), env=env, **shared)
        clients = [claude(g, g.key("eng", env=env), **session) for g in (closed, opened)]
        for client in clients:  # keys verified and the vault used while Redis is up
            client.messages.create(**ask)
    for fake in fakes.all():
        fake.reset()
    with pytest.raises(anthropic.APIStatusError) as refused:
        clients[0].messages.create(**ask)
    assert refused.value.status_code == 503 and refused.value.body["error"]["message"].startswith("the PII guard could not inspect")
    assert received(fakes) == []
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(echo=True))
    answer = clients[1].messages.create(**ask)  # the policy chose availability: this request's own mapping
    assert fakes.anthropic_us.received[0].json["messages"][0]["content"] == "mail <EMAIL_1>"
    assert answer.content[0].text == f"mail {EMAIL}"
    started = [r for r in opened.audit_records() if r["event"] == "request_started"][-1]
    assert started["pii"]["degraded"] == ["vault"] and started["pii"]["session"] is False


def test_replicas_share_a_session_through_the_redis_vault(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services) -> None:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url, "VAULT_KEY": "11" * 32}
    settings = {"store": {"kind": "shared", "redis_prefix": services.redis_prefix}, "pii": {"vault": {"key_env": "VAULT_KEY"}}}
    bundle = pii_bundle(tmp_path / "b")
    first, second = fresh_gateway(bundle=bundle, env=env, **settings), fresh_gateway(bundle=bundle, env=env, **settings)
    key = first.key("eng", "alice", env=env)
    session = {"x-portcullis-session-id": f"conv-{uuid.uuid4().hex}"}
    claude(first, key, **session).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"{OTHER_EMAIL} and {EMAIL}"}]
    )
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="Answer <EMAIL_2> first."))
    answer = claude(second, key, **session).messages.create(
        model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": f"who is {EMAIL}?"}]
    )
    assert fakes.anthropic_us.received[1].json["messages"][0]["content"] == "who is <EMAIL_2>?"  # the other replica's numbering
    assert answer.content[0].text == f"Answer {EMAIL} first."


# --- cache honesty per action --------------------------------------------------------------


@pytest.mark.parametrize("action", ["mask", "redact", "tokenize", "pseudonymize"])
def test_every_action_keeps_the_prefix_byte_stable_across_turns(action: str, tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """Cache honesty, per action and without a session: replacements are deterministic,
    so turn 2's upstream body begins with turn 1's bytes."""
    policy = {"p": {"teams": ["eng"], "actions": {"EMAIL": action, "CREDIT_CARD": action}}}
    gateway = fresh_gateway(bundle=pii_bundle(tmp_path / "b", policy))
    client = claude(gateway, gateway.key("eng"))
    turn1 = [{"role": "user", "content": f"Card {CARD} belongs to {EMAIL}"}]
    turn2 = [*turn1, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"And {OTHER_EMAIL}?"}]
    for messages in (turn1, turn2):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=10, system=f"Escalate to {OTHER_EMAIL}", messages=messages)
    first, second = (r.body for r in fakes.anthropic_us.received)
    assert second.startswith(first[: first.index(b'"}]') + 2]) and CARD.encode() not in second
