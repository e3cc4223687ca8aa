"""A request's bound end to end: what it may cost, keeping the provider to it, and
settling answers without usage or with the client gone."""

from __future__ import annotations

import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Fakes
from tests.fakes import Reply
from tests.governance_helpers import BODY, METERED, METERED_CHAT, METERED_CHAT_UPSTREAM, METERED_UPSTREAM, budget_cap, headers, metered_bundle, unique_team

pytestmark = pytest.mark.served


# --- the bound: what a request may cost, and keeping the provider to it ---------------------------


def test_hard_limits_cap_the_output_the_provider_may_produce(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A bound is only a bound if the provider is held to it: under a hard limit the
    gateway sets the output limit it reserved for; without one the body goes unchanged."""
    capped, free = unique_team(), unique_team()
    rules = {f"{capped}-cap": {"subject": {"team": capped}, "budget": {"limit_usd": "1.00", "period": "CalendarDay"}}}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", capped, rules, extra_teams=(free,)))
    for team in (capped, free):
        chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
        chat.chat.completions.create(model=METERED_CHAT, messages=[{"role": "user", "content": "no limit given"}])
        chat.chat.completions.create(model=METERED_CHAT, max_tokens=5000, messages=[{"role": "user", "content": "over the model's"}])
        messages = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key(team), max_retries=0)
        messages.messages.create(model=METERED, max_tokens=5000, messages=[{"role": "user", "content": "over the model's"}])
    sent = [r.json for r in fakes.openai_main.requests_for(METERED_CHAT_UPSTREAM)]
    assert [(s.get("max_tokens"), s.get("max_completion_tokens")) for s in sent] == [(None, 1000), (1000, None), (None, None), (5000, None)]
    assert [r.json["max_tokens"] for r in fakes.anthropic_us.requests_for(METERED_UPSTREAM)] == [1000, 5000]


def test_every_choice_counts_in_the_bound(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """n=2 may produce twice the output: $0.10 fits a $0.12 cap, n=3's $0.15 does not."""
    team = unique_team()
    rules = budget_cap(team, "0.12", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
    ask = {"model": METERED_CHAT, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    assert client.chat.completions.create(n=2, **ask).choices
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(n=3, **ask)
    assert refused.value.status_code == 402 and refused.value.body["code"] == "request_exceeds_limit"
    assert len(fakes.openai_main.requests_for(METERED_CHAT_UPSTREAM)) == 1


def test_an_answer_without_usage_keeps_its_bound_pending(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    """A provider that reports no usage is not assumed free: the bound stays charged
    until reconciliation finds the real figure, and the next call meets the cap."""
    team = unique_team()
    rules = budget_cap(team, "0.06", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)
    ask = {"model": METERED_CHAT, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    fakes.openai_main.script(METERED_CHAT_UPSTREAM, Reply(reports_usage=False), Reply(reports_usage=False))
    answered = client.chat.completions.with_raw_response.create(**ask)
    assert answered.parse().choices[0].message.content
    assert gateway.outcome(answered.headers["x-portcullis-request-id"])["settlement"] == "pending"
    streamed = [chunk for chunk in client.chat.completions.create(stream=True, **{**ask, "max_tokens": 100})]
    assert streamed and gateway.settled()[-1]["settlement"] == "pending"
    with pytest.raises(openai.APIStatusError) as refused:  # $0.05 + $0.005 held; another $0.05 does not fit
        client.chat.completions.create(**ask)
    assert refused.value.status_code == 402 and refused.value.body["code"] == "budget_exceeded"


def test_a_client_gone_before_the_first_byte_still_settles(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    team = unique_team()
    rules = budget_cap(team, "1.00", "CalendarDay")
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules))
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(delay=1.0, event_delay=0.2))
    key = gateway.key(team)
    with pytest.raises(httpx.ReadTimeout), httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key), timeout=0.3):
        pass
    time.sleep(1.5)  # the provider answers after the client left
    [outcome] = [r for r in gateway.settled() if r["event"] in ("request_cancelled", "request_finished", "request_failed")]
    assert outcome["event"] == "request_cancelled" and outcome["settlement"] == "pending"
