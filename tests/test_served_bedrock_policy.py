"""Bedrock policy, served: the region lock holding for the ``apac.`` inference profile
(a principal gets a profile only when its whole region set is allowed) and a Bedrock
guardrail the bundle requires reaching Bedrock in place of the client's, with boto3
and Messages clients through a real gateway to the fake Bedrocks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
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
)
from tests.bundles import APAC_PROFILE_REGIONS
from tests.conftest import BedrockFakes, Fakes, GatewayProcess
from tests.fakes import Fail, Intervene, Reply

pytestmark = pytest.mark.served

GUARDRAIL = {"identifier": "gr0a1b2c3d4e5", "version": "3", "trace": "enabled"}


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

UNWIRED = (
    "the decision plan carries the guardrail (engine/plan.py Plan.guardrail) and dispatch applies Call.guardrail "
    "(adapters/dispatch.py), but Executor._call (adapters/executor.py) never sets Call(guardrail=...) from exchange.plan, "
    "so no guardrail reaches Bedrock"
)


@pytest.mark.xfail(strict=True, reason=UNWIRED)
def test_the_policys_guardrail_replaces_the_clients_in_converse(policed: GatewayProcess, bedrock: BedrockFakes) -> None:
    own = {"guardrailIdentifier": "clientsown", "guardrailVersion": "1", "trace": "disabled"}
    boto3_client(policed, issue(policed, team="guarded")).converse(modelId=SONNET_ID, guardrailConfig=own, **CONVERSE)
    (sent,) = bedrock.apne2.received
    assert sent.json["guardrailConfig"] == {"guardrailIdentifier": "gr0a1b2c3d4e5", "guardrailVersion": "3", "trace": "enabled"}


@pytest.mark.xfail(strict=True, reason=UNWIRED)
def test_a_guardrail_intervention_reaches_a_messages_client_as_a_refusal(policed: GatewayProcess, bedrock: BedrockFakes, fakes: Fakes) -> None:
    bedrock.apne2.script(APAC_ID, Intervene("Sorry, that is not allowed here."))
    client = anthropic.Anthropic(base_url=policed.url, api_key=policed.key("guarded"), max_retries=0)
    message = client.messages.create(model=CANONICAL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    (sent,) = bedrock.apne2.received
    assert sent.headers["x-amzn-bedrock-guardrailidentifier"] == "gr0a1b2c3d4e5" and sent.headers["x-amzn-bedrock-guardrailversion"] == "3"
    assert message.content[0].text == "Sorry, that is not allowed here."
