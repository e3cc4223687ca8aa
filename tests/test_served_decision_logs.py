"""Decision logs end to end: a gateway with ``decision_logs`` writes one OPA decision-log
event per decided request — its decision_id the audit record's, its input masked and
without the prompt, its result the decision — to a file, and posts them gzip-compressed
to an HTTP service, retrying a failure. A request refused before the policy decided is
not logged."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.conftest import Fakes, WebhookReceiver, wait_for
from tests.pii_helpers import claude

pytestmark = pytest.mark.served

PROMPT = "PROMPT-TEXT-never-in-a-decision-log"
TOKEN_ENV = "PORTCULLIS_TEST_DECISION_LOG_TOKEN"
MASK = ["/input/principal/user", "/input/request/tools"]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ask(client: anthropic.Anthropic, model: str = "claude-sonnet-4-5") -> str:
    """One request with a tool and a prompt; its request id, served or refused."""
    try:
        response = client.messages.with_raw_response.create(
            model=model,
            max_tokens=32,
            messages=[{"role": "user", "content": PROMPT}],
            tools=[{"name": "get_weather", "description": "the weather", "input_schema": {"type": "object"}}],
        )
    except anthropic.APIStatusError as error:
        return error.response.headers["x-portcullis-request-id"]
    return response.headers["x-portcullis-request-id"]


def test_each_decided_request_is_one_masked_event_named_by_its_audit_record(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    path = tmp_path / "decisions.jsonl"
    gateway = fresh_gateway(decision_logs={"file": {"path": str(path)}, "mask": MASK, "flush_seconds": 0.1})
    served = ask(claude(gateway, gateway.key("eng", "dave")))
    refused = ask(claude(gateway, gateway.key("sonnet-only")), "claude-opus-4-1")  # the policy refuses it: a decision all the same
    unauthenticated = ask(claude(gateway, "pk_not-a-key"))  # refused before any decision: nothing to log
    assert wait_for(lambda: len(events(path)) >= 2)  # written while serving, flush_seconds after each decision
    records = gateway.settled()
    gateway.stop()  # closing writes whatever is still pending: the file is complete now
    [started] = [r for r in records if r["event"] == "request_started"]
    [denied] = [r for r in records if r["event"] == "request_denied" and r.get("decision")]
    assert started["request_id"] == started["decision_id"] == served and denied["request_id"] == denied["decision_id"] == refused
    [first, second] = events(path)  # one event per decision, none for the request refused before one
    assert (first["decision_id"], second["decision_id"]) == (served, refused) and unauthenticated not in path.read_text()

    assert first["path"] == "portcullis/decision" and first["labels"]["app"] == "portcullis" and first["labels"]["version"]
    assert first["bundles"] == {"portcullis": {"revision": started["bundle"]["revision"]}} and first["bundle_digest"] == started["bundle"]["digest"]
    # The input the policy read, masked: the user and the tools removed, the rest kept; never the prompt.
    assert first["input"]["principal"] == {"key_id": started["principal"]["key_id"], "team": "eng"}
    assert first["input"]["request"]["model"] == "claude-sonnet-4-5" and "tools" not in first["input"]["request"]
    assert first["erased"] == second["erased"] == MASK  # a key without a user still has the field (null): it goes too
    assert second["input"]["principal"] == {"key_id": denied["principal"]["key_id"], "team": "sonnet-only"}
    assert PROMPT not in path.read_text() and "get_weather" not in path.read_text()
    # The result is the decision the audit record summarises.
    result = first["result"]
    assert result["allow"] is True and result["model"] == started["model"] == "claude-sonnet-4-5"
    assert [f"{t['provider']}/{t['model']}@{t['region']}" for t in result["targets"]] == started["decision"]["targets"]
    assert second["result"]["allow"] is False and [r["code"] for r in second["result"]["reasons"]] == denied["decision"]["reasons"]
    assert gateway.logs().count(PROMPT) == 0


def test_events_are_posted_gzip_compressed_and_a_failed_post_is_retried(tmp_path: Path, fresh_gateway, fakes: Fakes, webhook_receiver: WebhookReceiver) -> None:
    log_service = webhook_receiver
    log_service.statuses = [503]
    log_service.url = log_service.url.replace("/hook", "/logs?token=qs-secret")  # a token in the query is never logged
    gateway = fresh_gateway(
        decision_logs={"http": {"url": log_service.url, "bearer_token_env": TOKEN_ENV}, "mask": MASK, "flush_seconds": 0.1},
        env={TOKEN_ENV: "dl-token-123"},
    )
    served = ask(claude(gateway, gateway.key("eng", "dave")))
    assert wait_for(lambda: len(log_service.received) >= 2, timeout=10)

    failed, delivered = log_service.received[:2]
    assert failed["raw"] == delivered["raw"]  # the same batch, sent again
    headers = delivered["headers"]
    assert headers["content-encoding"] == "gzip" and headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer dl-token-123"
    [event] = json.loads(gzip.decompress(delivered["raw"]))
    [started] = [r for r in gateway.settled() if r["event"] == "request_started"]
    assert event["decision_id"] == started["decision_id"] == served
    assert "user" not in event["input"]["principal"] and "tools" not in event["input"]["request"] and event["result"]["allow"] is True
    assert PROMPT.encode() not in gzip.decompress(delivered["raw"])
    logs = gateway.logs()
    assert "qs-secret" not in logs and "dl-token-123" not in logs


def test_a_missing_bearer_token_stops_start_up(fresh_gateway, webhook_receiver: WebhookReceiver) -> None:
    with pytest.raises(RuntimeError, match=f"decision_logs.http.bearer_token_env: environment variable {TOKEN_ENV} is not set"):
        fresh_gateway(decision_logs={"http": {"url": webhook_receiver.url, "bearer_token_env": TOKEN_ENV}}, env={TOKEN_ENV: ""})
