"""The audit log and the ledger agree on what every request is charged: a request whose
settlement is pending (cut stream, lost usage, a timeout after the provider may have
worked) carries the bound the ledger holds for it, never 0 — on both ledgers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import OUTCOME_EVENTS, Fakes, GatewayProcess, Services
from tests.fakes import CutStream, Fail, Hang, Reply
from tests.governance_helpers import (
    ACTUAL,
    BODY,
    BOUND,
    METERED_CHAT,
    METERED_CHAT_UPSTREAM,
    METERED_UPSTREAM,
    budget_cap,
    headers,
    metered_bundle,
    shared,
    unique_team,
)

pytestmark = pytest.mark.served

CHAT_BODY = {"model": METERED_CHAT, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}


def ledger_charges(gateway: GatewayProcess, kind: str, services: Services | None, team: str) -> dict[str, int]:
    query = "SELECT request_id, cost_micro_usd FROM reservations WHERE team = "
    if kind == "embedded":
        with sqlite3.connect(gateway.directory / "state.db") as connection:
            return dict(connection.execute(query + "?", (team,)).fetchall())
    assert services is not None
    with psycopg.connect(services.database_url) as connection:
        return dict(connection.execute(query + "%s", (team,)).fetchall())


@pytest.mark.parametrize("kind", ["embedded", "shared"])
def test_audit_charges_equal_ledger_charges(kind: str, tmp_path: Path, fresh_gateway, fakes: Fakes, request: pytest.FixtureRequest) -> None:
    services: Services | None = request.getfixturevalue("services") if kind == "shared" else None
    team = unique_team()
    bundle = metered_bundle(tmp_path / "b", team, budget_cap(team, "10.00", "CalendarMonth"))
    if services is not None:
        env, store = shared(services)
        gateway = fresh_gateway(bundle=bundle, env=env, store=store)
        key = gateway.key(team, env=env)
    else:
        gateway = fresh_gateway(bundle=bundle)
        key = gateway.key(team)
    fakes.anthropic_us.script(METERED_UPSTREAM, Reply(), CutStream(after=4), Hang(5), Fail(400))
    fakes.openai_main.script(METERED_CHAT_UPSTREAM, Reply(reports_usage=False))
    send = lambda body, **extra: httpx.post(f"{gateway.url}{extra.pop('path', '/v1/messages')}", json=body, headers=headers(key), timeout=30)  # noqa: E731

    ids = {}
    ids["settled"] = send(BODY).headers["x-portcullis-request-id"]
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json={**BODY, "stream": True}, headers=headers(key)) as cut:
        ids["cut stream"] = cut.headers["x-portcullis-request-id"]
        cut.read()
    ids["timeout"] = send(BODY).headers["x-portcullis-request-id"]
    ids["refused upstream"] = send(BODY).headers["x-portcullis-request-id"]
    ids["no usage"] = send(CHAT_BODY, path="/v1/chat/completions").headers["x-portcullis-request-id"]

    outcomes = {r["request_id"]: r for r in gateway.settled() if r["event"] in OUTCOME_EVENTS}
    charged = {name: outcomes[request_id]["charged_micro_usd"] for name, request_id in ids.items()}
    assert charged == {"settled": ACTUAL, "cut stream": BOUND, "timeout": BOUND, "refused upstream": 0, "no usage": BOUND}
    assert {name: outcomes[request_id]["settlement"] for name, request_id in ids.items()} == {
        "settled": "settled",
        "cut stream": "pending",
        "timeout": "pending",
        "refused upstream": "released",
        "no usage": "pending",
    }
    ledger = ledger_charges(gateway, kind, services, team)
    assert {name: ledger[request_id] for name, request_id in ids.items()} == charged  # request by request
    assert sum(r["charged_micro_usd"] for r in outcomes.values()) == sum(ledger.values())  # and in total


def test_a_requests_sub_calls_count_in_its_audit_charge(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    from tests.pii_helpers import SONNET_UPSTREAM, classifier_bundle

    rules = {"eng-day": {"subject": {"team": "eng"}, "budget": {"limit_usd": "5", "period": "CalendarDay"}}}
    gateway = fresh_gateway(bundle=classifier_bundle(tmp_path / "b", rules))
    fakes.openai_main.script("pii-classifier-8b", Reply(text='{"findings": []}', input_tokens=300, output_tokens=40))
    fakes.anthropic_us.script(SONNET_UPSTREAM, CutStream(after=4))  # the main call stays pending at its bound
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Ann Lee"}]}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, headers=headers(gateway.key("eng"))) as cut:
        request_id = cut.headers["x-portcullis-request-id"]
        cut.read()
    with sqlite3.connect(gateway.directory / "state.db") as connection:
        rows = dict(connection.execute("SELECT subcall, cost_micro_usd FROM reservations WHERE request_id = ?", (request_id,)).fetchall())
    assert rows["pii_classifier"] == 380 and rows["main"] > 0
    assert gateway.outcome(request_id)["charged_micro_usd"] == rows["pii_classifier"] + rows["main"]
