"""Circuit breakers (L6) and cache domains, end to end: official SDKs against gateway
processes, the fake providers failing on demand.

A target that fails ``consecutive_failures`` times in a row is left out of plans
(rejected ``breaker_open``, no attempt on it) until its cool-off ends; then exactly one
probe goes to it, whose success closes the breaker and whose failure opens it again.
Every target open is a 503 with Retry-After in the client's protocol; the client's own
errors never count; replicas on the shared store see the same breakers. A conversation
served by the second target stays there on its next turn while it is healthy.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import botocore.exceptions
import openai
import pytest

from tests.bedrock_helpers import APAC_ID, CONVERSE, NOVA, SONNET_ID, bedrock_gateway, boto3_client, issue, reference_bundle
from tests.bundles import write_bundle
from tests.conftest import BedrockFakes, Fakes, GatewayProcess, Services
from tests.fakes import Fail, Reply, StreamError
from tests.governance_helpers import shared

pytestmark = pytest.mark.served

SONNET_UPSTREAM = "claude-sonnet-4-5-20250929"
OPUS_UPSTREAM = "claude-opus-4-1-20250805"
MINI_UPSTREAM = "gpt-4o-mini-2024-07-18"
US = f"anthropic-us/{SONNET_UPSTREAM}@us-east-1"
EU = f"anthropic-eu/{SONNET_UPSTREAM}@eu-west-1"
FAILURES = 3
OPEN_SECONDS = 2


def breaker_bundle(directory: Path, pin: bool = False) -> Path:
    sections: dict[str, Any] = {"breakers": {"default": {"consecutive_failures": FAILURES, "open_seconds": OPEN_SECONDS}}}
    if pin:
        sections["cache_domains"] = {"pin": True, "ttl_seconds": 600}
    return write_bundle(directory, sections=sections)


def claude(gateway: GatewayProcess, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key or gateway.key("eng"), max_retries=0)


def ask(gateway: GatewayProcess, text: str = "Hi", key: str | None = None) -> str:
    """One request for sonnet; its request id."""
    response = claude(gateway, key).messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=[{"role": "user", "content": text}])
    assert response.status_code == 200
    return response.headers["x-portcullis-request-id"]


def started(gateway: GatewayProcess, request_id: str) -> dict[str, Any]:
    return next(r for r in gateway.records_for(request_id) if r["event"] == "request_started")


def attempts(gateway: GatewayProcess, request_id: str) -> list[tuple[str, str]]:
    return [(a["provider"], a["outcome"]) for a in gateway.outcome(request_id)["attempts"]]


def events(gateway: GatewayProcess, name: str) -> list[dict[str, Any]]:
    return [r for r in gateway.audit_records() if r["event"] == name]


def open_us(gateway: GatewayProcess, fakes: Fakes, key: str | None = None) -> None:
    """anthropic-us fails FAILURES times in a row; each request fails over to anthropic-eu."""
    fakes.anthropic_us.script(SONNET_UPSTREAM, *[Fail(503) for _ in range(FAILURES)])
    for n in range(FAILURES):
        request_id = ask(gateway, f"fail {n} {uuid.uuid4().hex}", key)
        assert attempts(gateway, request_id) == [("anthropic-us", "status_503"), ("anthropic-eu", "ok")]


def test_consecutive_failures_open_the_breaker_and_requests_skip_the_target(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    open_us(gateway, fakes)
    opened = events(gateway, "breaker_opened")
    assert [(e["target"], e["failures"]) for e in opened] == [(US, FAILURES)]
    assert "breaker opened" in gateway.logs() and US in gateway.logs()

    request_id = ask(gateway)
    assert attempts(gateway, request_id) == [("anthropic-eu", "ok")]  # no attempt on the open one
    rejected = started(gateway, request_id)["decision"]["rejected_targets"]
    assert rejected == [{"provider": "anthropic-us", "model": SONNET_UPSTREAM, "region": "us-east-1", "reasons": ["breaker_open"]}]
    assert len(fakes.anthropic_us.received) == FAILURES


def test_after_the_cool_off_one_probe_goes_and_its_success_closes_the_breaker(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    key = gateway.key("eng")
    open_us(gateway, fakes, key)
    time.sleep(OPEN_SECONDS + 0.2)
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(delay=1.0))  # the probe is slow: the others arrive while it is out
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        request_ids = list(pool.map(lambda n: ask(gateway, f"probe {n}", key), range(6)))
    tried = [attempts(gateway, request_id) for request_id in request_ids]
    probes = [t for t in tried if t == [("anthropic-us", "ok")]]
    assert len(probes) == 1, tried
    assert all(t == [("anthropic-us", "breaker_open"), ("anthropic-eu", "ok")] for t in tried if t not in probes)
    assert len(fakes.anthropic_us.received) == FAILURES + 1
    probe = next(a for r in request_ids for a in gateway.outcome(r)["attempts"] if a.get("breaker_probe"))
    assert probe["provider"] == "anthropic-us"
    assert [e["target"] for e in events(gateway, "breaker_closed")] == [US]

    request_id = ask(gateway)
    assert attempts(gateway, request_id) == [("anthropic-us", "ok")]  # closed: back to the first target


def test_a_failed_probe_opens_the_breaker_again(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    open_us(gateway, fakes)
    time.sleep(OPEN_SECONDS + 0.2)
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(500))
    probe = ask(gateway)
    assert attempts(gateway, probe) == [("anthropic-us", "status_500"), ("anthropic-eu", "ok")]
    assert [e["target"] for e in events(gateway, "breaker_reopened")] == [US]
    request_id = ask(gateway)
    assert attempts(gateway, request_id) == [("anthropic-eu", "ok")]
    assert started(gateway, request_id)["decision"]["rejected_targets"][0]["reasons"] == ["breaker_open"]
    assert len(fakes.anthropic_us.received) == FAILURES + 1


def test_every_target_open_is_a_503_with_retry_after_in_each_protocol(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(OPUS_UPSTREAM, *[Fail(502) for _ in range(FAILURES)])
    fakes.openai_main.script(MINI_UPSTREAM, *[Fail(500) for _ in range(FAILURES)])
    opus = claude(gateway)
    chat = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key("eng"), max_retries=0)
    for _ in range(FAILURES):
        with pytest.raises(anthropic.APIStatusError) as failed:
            opus.messages.create(model="claude-opus-4-1", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        assert failed.value.status_code == 502
        with pytest.raises(openai.APIStatusError) as failed_openai:
            chat.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
        assert failed_openai.value.status_code == 502

    with pytest.raises(anthropic.APIStatusError) as unavailable:
        opus.messages.create(model="claude-opus-4-1", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert unavailable.value.status_code == 503
    assert unavailable.value.body["type"] == "error" and "unavailable" in unavailable.value.body["error"]["message"]
    assert 1 <= int(unavailable.value.response.headers["retry-after"]) <= OPEN_SECONDS + 1  # to the whole second it half-opens
    with pytest.raises(openai.APIStatusError) as unavailable_chat:
        chat.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.APIStatusError) as unavailable_responses:
        chat.responses.create(model="gpt-4o-mini", input="Hi")
    for refused in (unavailable_chat.value, unavailable_responses.value):
        assert refused.status_code == 503 and refused.code == "targets_unavailable"
        assert 1 <= int(refused.response.headers["retry-after"]) <= OPEN_SECONDS + 1
    assert len(fakes.anthropic_us.requests_for(OPUS_UPSTREAM)) == FAILURES and len(fakes.openai_main.received) == FAILURES
    denied = [r for r in gateway.audit_records() if r["event"] == "request_denied"]
    assert [(r["protocol"], r["error"]["code"]) for r in denied] == [
        ("anthropic_messages", "targets_unavailable"),
        ("openai_chat", "targets_unavailable"),
        ("openai_responses", "targets_unavailable"),
    ]
    assert all(r["decision"]["rejected_targets"][0]["reasons"] == ["breaker_open"] for r in denied)


def test_streams_that_fail_before_their_first_byte_count(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, *[StreamError(after=0) for _ in range(FAILURES)])
    for n in range(FAILURES):
        with claude(gateway).messages.stream(model="sonnet", max_tokens=8, messages=[{"role": "user", "content": f"stream {n}"}]) as stream:
            assert "".join(stream.text_stream) == "Hello from the fake provider."  # failed over before anything reached the client
    assert [e["target"] for e in events(gateway, "breaker_opened")] == [US]
    with claude(gateway).messages.stream(model="sonnet", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as stream:
        "".join(stream.text_stream)
        request_id = stream.response.headers["x-portcullis-request-id"]
    assert attempts(gateway, request_id) == [("anthropic-eu", "ok")]
    assert len(fakes.anthropic_us.received) == FAILURES


def test_client_errors_do_not_count(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b"))
    fakes.anthropic_us.script(SONNET_UPSTREAM, *[Fail(400) for _ in range(FAILURES + 2)])
    for _ in range(FAILURES + 2):
        with pytest.raises(anthropic.BadRequestError):
            claude(gateway).messages.create(model="sonnet", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    request_id = ask(gateway)
    assert attempts(gateway, request_id) == [("anthropic-us", "ok")]
    assert not events(gateway, "breaker_opened")
    assert not fakes.anthropic_eu.received  # a request the provider refused as wrong is not failed over either


def test_replicas_on_the_shared_store_see_the_same_breakers(fresh_gateway, fakes: Fakes, tmp_path: Path, services: Services) -> None:
    env, store = shared(services, redis_prefix=f"{services.redis_prefix}{uuid.uuid4().hex[:8]}:")  # this test's own breakers
    bundle = breaker_bundle(tmp_path / "b")
    one, other = (fresh_gateway(bundle=bundle, env=env, store=store) for _ in range(2))
    key = one.key("eng", env=env)
    open_us(one, fakes, key)
    time.sleep(0.6)  # past the other replica's cached reading
    request_id = ask(other, "on the other replica", key)
    assert attempts(other, request_id) == [("anthropic-eu", "ok")]
    assert started(other, request_id)["decision"]["rejected_targets"][0]["reasons"] == ["breaker_open"]

    time.sleep(OPEN_SECONDS + 0.2)
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(delay=1.0))
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        request_ids = list(pool.map(lambda n: (n % 2, ask((one, other)[n % 2], f"probe {n}", key)), range(6)))
    tried = [attempts((one, other)[replica], request_id) for replica, request_id in request_ids]
    assert sum(t == [("anthropic-us", "ok")] for t in tried) == 1, tried  # one probe across both replicas
    assert len(fakes.anthropic_us.received) == FAILURES + 1
    time.sleep(0.6)
    assert attempts(other, ask(other, "closed now", key)) == [("anthropic-us", "ok")]


def test_a_conversation_stays_in_the_cache_domain_that_served_it(fresh_gateway, fakes: Fakes, tmp_path: Path) -> None:
    gateway = fresh_gateway(bundle=breaker_bundle(tmp_path / "b", pin=True))
    client = claude(gateway)
    first_turn = [{"role": "user", "content": "Review this diff, please."}]
    fakes.anthropic_us.script(SONNET_UPSTREAM, Fail(529))  # the first target fails once
    response = client.messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=first_turn)
    assert attempts(gateway, response.headers["x-portcullis-request-id"]) == [("anthropic-us", "status_529"), ("anthropic-eu", "ok")]

    next_turn = [*first_turn, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "And the tests?"}]
    for _ in range(2):  # healthy again, but the conversation's cache is in eu-west-1
        response = client.messages.with_raw_response.create(model="sonnet", max_tokens=8, messages=next_turn)
        request_id = response.headers["x-portcullis-request-id"]
        assert attempts(gateway, request_id) == [("anthropic-eu", "ok")]
        assert started(gateway, request_id)["cache_domain_pinned"] == EU
    assert len(fakes.anthropic_us.received) == 1

    request_id = ask(gateway, "A new conversation")
    assert attempts(gateway, request_id) == [("anthropic-us", "ok")]
    assert "cache_domain_pinned" not in started(gateway, request_id)
    records = json.dumps(gateway.audit_records())
    assert "Review this diff" not in records and "And the tests" not in records  # the pin keeps hashes and target names only


# --- Bedrock: the reference routing (Seoul, Oregon, Anthropic direct) ------------------------


@pytest.fixture
def bedrock_breakers(tmp_path: Path, fakes: Fakes, bedrock: BedrockFakes) -> Iterator[Callable[[bool], GatewayProcess]]:
    """Start a gateway on the reference routing with breakers (and the cache-domain pin
    if asked); every gateway started is stopped after the test."""
    started: list[GatewayProcess] = []

    def start(pin: bool = False) -> GatewayProcess:
        sections: dict[str, Any] = {"breakers": {"default": {"consecutive_failures": FAILURES, "open_seconds": OPEN_SECONDS}}}
        if pin:
            sections["cache_domains"] = {"pin": True}
        started.append(bedrock_gateway(tmp_path, fakes, bedrock, bundle=reference_bundle(tmp_path / "bundle", sections=sections)))
        return started[-1]

    yield start
    for gateway in started:
        gateway.stop()


def test_every_target_open_is_a_bedrock_service_unavailable(bedrock_breakers: Callable[..., GatewayProcess], bedrock: BedrockFakes) -> None:
    gateway = bedrock_breakers()
    client = boto3_client(gateway, issue(gateway))
    bedrock.usw2.script(NOVA, *[Fail(500) for _ in range(FAILURES)])
    for n in range(FAILURES):  # each its own body: a signed request sent twice in a second is a replay
        with pytest.raises(botocore.exceptions.ClientError) as failed:
            client.converse(modelId=NOVA, messages=[{"role": "user", "content": [{"text": f"Say hello {n}."}]}])
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
    with pytest.raises(botocore.exceptions.ClientError) as unavailable:
        client.converse(modelId=NOVA, **CONVERSE)
    assert unavailable.value.response["Error"]["Code"] == "ServiceUnavailableException"
    assert unavailable.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert 1 <= int(unavailable.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"]) <= OPEN_SECONDS + 1
    assert len(bedrock.usw2.requests_for(NOVA)) == FAILURES


def test_a_bedrock_conversation_stays_in_the_region_that_served_it(bedrock_breakers: Callable[..., GatewayProcess], bedrock: BedrockFakes) -> None:
    gateway = bedrock_breakers(pin=True)
    client = boto3_client(gateway, issue(gateway))
    bedrock.apne2.script(APAC_ID, Fail(503))  # Seoul fails once: Oregon serves, and holds the conversation's cache now
    first_turn = [{"role": "user", "content": [{"text": "Summarise the design doc."}]}]
    answer = client.converse(modelId=SONNET_ID, messages=first_turn, inferenceConfig={"maxTokens": 64})
    assert [(a["provider"], a["outcome"]) for a in gateway.outcome(answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"])["attempts"]] == [
        ("bedrock-apne2", "status_503"),
        ("bedrock-usw2", "ok"),
    ]
    next_turn = [*first_turn, {"role": "assistant", "content": [{"text": "Sure."}]}, {"role": "user", "content": [{"text": "Shorter."}]}]
    answer = client.converse(modelId=SONNET_ID, messages=next_turn, inferenceConfig={"maxTokens": 64})
    request_id = answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"]
    assert attempts(gateway, request_id) == [("bedrock-usw2", "ok")]
    assert started(gateway, request_id)["cache_domain_pinned"] == f"bedrock-usw2/{SONNET_ID}@us-west-2"
    assert len(bedrock.apne2.received) == 1 and len(bedrock.usw2.received) == 2
    answer = client.converse(modelId=SONNET_ID, **CONVERSE)  # another conversation starts where the route does
    assert attempts(gateway, answer["ResponseMetadata"]["HTTPHeaders"]["x-portcullis-request-id"]) == [("bedrock-apne2", "ok")]
