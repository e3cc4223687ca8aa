"""Bedrock policy, served: the region lock holding for the ``apac.`` inference profile
(a principal gets a profile only when its whole region set is allowed) and a Bedrock
guardrail the bundle requires reaching Bedrock in place of the client's, its
interventions reported to the client in its protocol and audited (that, never what),
and Anthropic direct served without it — with boto3 and Messages clients through a real
gateway to the fake Bedrocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import botocore.exceptions
import pytest

from tests.bedrock_helpers import (
    APAC_ID,
    CANONICAL,
    CONVERSE,
    SONNET_ID,
    bedrock_gateway,
    boto3_client,
    issue,
    operations,
    reference_bundle,
    reference_tenants,
    streamed_text,
)
from tests.bundles import APAC_PROFILE_REGIONS
from tests.conftest import BedrockFakes, Fakes, GatewayProcess
from tests.fakes import Fail, Intervene, Reply

pytestmark = pytest.mark.served

GUARDRAIL = {"identifier": "gr0a1b2c3d4e5", "version": "3"}


def _tenants() -> dict[str, Any]:
    tenants = reference_tenants()
    tenants["teams"] |= {
        "apac": {"models": ["claude-*"], "regions": APAC_PROFILE_REGIONS},
        "three-regions": {"models": ["claude-*"], "regions": ["ap-northeast-2", "us-west-2", "us-east-1"]},
        "guarded": {"models": ["claude-*"], "guardrail": GUARDRAIL},
    }
    return tenants


@pytest.fixture(scope="module")
def policed(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes, session_bedrock: BedrockFakes) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("bedrock-policy")
    running = bedrock_gateway(directory, session_fakes, session_bedrock, reference_bundle(directory / "bundle", tenants=_tenants()))
    yield running
    running.stop()


def _request_id(answer: dict[str, Any]) -> str:
    return answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"]


# --- region sets -------------------------------------------------------------------------


def test_a_principal_locked_to_the_profiles_set_is_served_by_it_alone(policed: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    bedrock.apne2.script(APAC_ID, Reply(text="From the APAC profile."), Fail(503))
    client = boto3_client(policed, issue(policed, team="apac"))
    answer = client.converse(modelId=SONNET_ID, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "From the APAC profile."
    started = next(r for r in policed.records_for(_request_id(answer)) if r["event"] == "request_started")
    assert started["decision"]["targets"] == [f"bedrock-apne2/{APAC_ID}@ap-northeast-2[{','.join(APAC_PROFILE_REGIONS)}]"]  # the set beside the region
    # Its only target failing, nothing outside the lock is tried.
    with pytest.raises(client.exceptions.ClientError):
        client.converse(modelId=SONNET_ID, messages=[{"role": "user", "content": [{"text": "Again?"}]}])
    assert operations(bedrock.apne2) == ["converse", "converse"] and not bedrock.usw2.received and not fakes.anthropic_us.received


def test_a_lock_holding_only_the_profiles_home_region_skips_the_profile(policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    answer = boto3_client(policed, issue(policed, team="three-regions")).converse(modelId=SONNET_ID, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "Hello from the fake provider."
    assert not bedrock.apne2.received and operations(bedrock.usw2) == ["converse"]
    started = next(r for r in policed.records_for(_request_id(answer)) if r["event"] == "request_started")
    assert [t.split("@")[0] for t in started["decision"]["targets"]] == [f"bedrock-usw2/{SONNET_ID}", "anthropic-us/claude-sonnet-4-5-20250929"]
    assert "region_not_allowed" in str(started["decision"]["rejected_targets"])


# --- guardrails --------------------------------------------------------------------------


def test_the_policys_guardrail_replaces_the_clients_in_converse(policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    own = {"guardrailIdentifier": "clientsown", "guardrailVersion": "1", "trace": "disabled"}
    answer = boto3_client(policed, issue(policed, team="guarded")).converse(modelId=SONNET_ID, guardrailConfig=own, **CONVERSE)
    (sent,) = bedrock.apne2.received
    assert sent.json["guardrailConfig"] == {"guardrailIdentifier": "gr0a1b2c3d4e5", "guardrailVersion": "3"}
    started = next(r for r in policed.records_for(_request_id(answer)) if r["event"] == "request_started")
    assert started["decision"]["guardrail"] == GUARDRAIL
    assert "guardrail_intervened" not in policed.outcome(_request_id(answer))


def test_a_client_asking_for_a_guardrail_trace_is_told_why_not(policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    own = {"guardrailIdentifier": "clientsown", "guardrailVersion": "1", "trace": "enabled"}
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        boto3_client(policed, issue(policed, team="guarded")).converse(modelId=SONNET_ID, guardrailConfig=own, **CONVERSE)
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException" and "guardrailConfig.trace" in error["Message"]
    assert bedrock.apne2.received == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_guardrail_intervention_reaches_boto3_as_bedrock_reports_it(stream: bool, policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Intervene("Sorry, that is not allowed here."))
    client = boto3_client(policed, issue(policed, team="guarded"))
    if stream:
        answer = client.converse_stream(modelId=SONNET_ID, **CONVERSE)
        events = list(answer["stream"])
        text, stop = streamed_text(events), next(e["messageStop"]["stopReason"] for e in events if "messageStop" in e)
    else:
        answer = client.converse(modelId=SONNET_ID, **CONVERSE)
        text, stop = answer["output"]["message"]["content"][0]["text"], answer["stopReason"]
    assert (text, stop) == ("Sorry, that is not allowed here.", "guardrail_intervened")
    (sent,) = bedrock.apne2.received
    assert sent.json["guardrailConfig"]["guardrailIdentifier"] == "gr0a1b2c3d4e5"
    outcome = policed.outcome(_request_id(answer))
    assert outcome["guardrail_intervened"] is True and "not allowed" not in json.dumps(outcome)  # that it did, never what


def test_a_guardrail_intervention_reaches_a_messages_client_through_invoke_model(policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    bedrock.apne2.script(APAC_ID, Intervene("Sorry, that is not allowed here."))
    client = anthropic.Anthropic(base_url=policed.url, api_key=policed.key("guarded"), max_retries=0)
    created = client.messages.with_raw_response.create(model=CANONICAL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert created.parse().content[0].text == "Sorry, that is not allowed here."
    (sent,) = bedrock.apne2.received
    assert operations(bedrock.apne2) == ["invoke"]
    assert sent.headers["x-amzn-bedrock-guardrailidentifier"] == "gr0a1b2c3d4e5" and sent.headers["x-amzn-bedrock-guardrailversion"] == "3"
    assert "x-amzn-bedrock-trace" not in sent.headers  # no trace: it would carry the unguarded output to the client
    assert policed.outcome(created.headers["x-portcullis-request-id"])["guardrail_intervened"] is True


def test_a_guardrail_is_bedrocks_so_anthropic_direct_serves_without_it(policed: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    for fake, model in ((bedrock.apne2, APAC_ID), (bedrock.usw2, SONNET_ID)):
        fake.script(model, Fail(503))
    answer = boto3_client(policed, issue(policed, team="guarded")).converse(modelId=SONNET_ID, **CONVERSE)
    assert answer["output"]["message"]["content"][0]["text"] == "Hello from the fake provider."
    assert [r.json["guardrailConfig"]["guardrailIdentifier"] for r in bedrock.apne2.received + bedrock.usw2.received] == ["gr0a1b2c3d4e5"] * 2
    (direct,) = fakes.anthropic_us.received
    assert "guardrail" not in direct.body.decode().lower()
