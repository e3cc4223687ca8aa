"""The Bedrock provider against the fake Bedrock Runtime over real HTTP: every request
is SigV4-signed with credentials from the AWS chain and verified by the fake; model ids,
inference profiles and ARNs go out percent-encoded exactly as signed; refreshes happen
off the event loop; nothing of the client's reaches AWS. No real credentials are used:
the chain is given fake keys through the environment and never probes instance metadata."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from botocore.credentials import ReadOnlyCredentials, RefreshableCredentials

from portcullis.adapters.config import ConfigError, ProviderConfig
from portcullis.adapters.protocols.eventstream import CONVERSE_FRAMING
from portcullis.adapters.providers import UpstreamUnreachable, build_provider
from portcullis.adapters.providers.bedrock import BedrockProvider, sign
from tests.fakes import FakeProvider, Redirect
from tests.fakes.sigv4 import ACCESS_KEY, SECRET_KEY, AwsKey

CONVERSE = json.dumps({"messages": [{"role": "user", "content": [{"text": "hello"}]}]}).encode()
SONNET = "anthropic.claude-3-5-sonnet-20240620-v1:0"
MODELS = [
    SONNET,
    "us.anthropic.claude-3-5-sonnet-20240620-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20240620-v1:0",
    "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-sonnet-20240620-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
]
_CHAIN_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_CREDENTIAL_EXPIRATION",
)


@pytest.fixture(scope="module")
def served() -> Iterator[FakeProvider]:
    fake = FakeProvider(name="bedrock-us-east-1").start()
    yield fake
    fake.stop()


@pytest.fixture
def fake(served: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeProvider:
    """The fake, reset, and an AWS chain that finds only the fake's keys in the environment."""
    served.reset()
    for name in _CHAIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    return served


def config(fake: FakeProvider, **fields: object) -> ProviderConfig:
    return ProviderConfig("bedrock-test", "bedrock", **{"base_url": fake.url, "region": fake.aws.region, **fields})  # type: ignore[arg-type]


def path_of(model: str, operation: str = "converse") -> str:
    return f"/model/{quote(model, safe='')}/{operation}"


async def _exchange(provider: BedrockProvider, path: str, body: bytes, headers: dict[str, str] | None, query: str) -> tuple[int, dict[str, str], bytes]:
    response = await provider.send(path, query, {"content-type": "application/json", **(headers or {})}, body)
    try:
        return response.status, {name.lower(): value for name, value in response.headers.items()}, await response.read(1 << 22)
    finally:
        response.release()


Answer = tuple[int, dict[str, str], bytes]


def send(provider: BedrockProvider, path: str, body: bytes = CONVERSE, headers: dict[str, str] | None = None, query: str = "") -> Answer:
    async def run() -> Answer:
        try:
            return await _exchange(provider, path, body, headers, query)
        finally:
            await provider.close()

    return asyncio.run(run())


def signer(fake: FakeProvider) -> str:
    match = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([^/]+)/([^/]+)/", fake.received[-1].headers["authorization"])
    assert match is not None
    return "/".join(match.groups())


def test_a_signed_request_is_accepted(fake: FakeProvider) -> None:
    status, _, body = send(BedrockProvider(config(fake)), path_of(SONNET))
    assert status == 200 and json.loads(body)["output"]["message"]["content"] == [{"text": "Hello from the fake provider."}]
    assert signer(fake) == f"{ACCESS_KEY}/us-east-1/bedrock"


def test_the_event_stream_arrives_as_bedrock_framed_it(fake: FakeProvider) -> None:
    status, headers, body = send(BedrockProvider(config(fake)), path_of(SONNET, "converse-stream"))
    events = CONVERSE_FRAMING.Parser().feed(body)
    assert status == 200 and headers["content-type"] == "application/vnd.amazon.eventstream"
    assert events[0].event == "messageStart" and events[-1].json()["metadata"]["usage"]["totalTokens"] == 120


@pytest.mark.parametrize(
    ("secret", "key", "error_type"),
    [("not-the-secret", ACCESS_KEY, "InvalidSignatureException"), (SECRET_KEY, "AKIAUNKNOWN000000000", "UnrecognizedClientException")],
)
def test_a_wrong_secret_or_unknown_key_is_refused(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, secret: str, key: str, error_type: str) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    status, headers, body = send(BedrockProvider(config(fake)), path_of(SONNET))
    assert status == 403 and headers["x-amzn-errortype"].split(":")[0] == error_type and "message" in json.loads(body)


@pytest.mark.parametrize("tamper", ["body", "path", "signed_header"])
def test_a_request_changed_after_signing_is_refused(fake: FakeProvider, tamper: str) -> None:
    url = fake.url + path_of(SONNET)
    headers = sign(ReadOnlyCredentials(ACCESS_KEY, SECRET_KEY, None), fake.aws.region, url, {"content-type": "application/json"}, CONVERSE)
    assert httpx.post(url, content=CONVERSE, headers=headers).status_code == 200  # as signed, accepted
    body, sent_url = CONVERSE, url
    if tamper == "body":
        body = CONVERSE.replace(b"hello", b"HELLO")
    elif tamper == "path":
        sent_url = fake.url + path_of("anthropic.claude-3-opus-20240229-v1:0")
    else:
        headers = {**headers, "content-type": "application/x-amz-json-1.1"}
    refused = httpx.post(sent_url, content=body, headers=headers)
    assert refused.status_code == 403 and refused.headers["x-amzn-errortype"].startswith("InvalidSignatureException:")


def test_a_session_token_is_sent_and_signed(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.aws.keys["ASIAFAKETEMPORARY001"] = AwsKey("temporary-secret", token="session-token-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAFAKETEMPORARY001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "temporary-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-1")
    status, _, _ = send(BedrockProvider(config(fake)), path_of(SONNET))
    received = fake.received[-1].headers
    assert status == 200 and received["x-amz-security-token"] == "session-token-1"
    assert "x-amz-security-token" in received["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")


@pytest.mark.parametrize("model", MODELS)
def test_model_ids_profiles_and_arns_go_out_percent_encoded_and_verified(fake: FakeProvider, model: str) -> None:
    status, _, _ = send(BedrockProvider(config(fake)), path_of(model))
    assert status == 200
    assert fake.received[-1].path == path_of(model) and fake.received[-1].model == model
    assert ":" not in fake.received[-1].path and (model.count("/") == 0 or "%2F" in fake.received[-1].path)


def test_a_path_with_its_colon_left_raw_is_encoded_before_it_is_signed(fake: FakeProvider) -> None:
    status, _, _ = send(BedrockProvider(config(fake)), f"/model/{SONNET}/converse")
    assert status == 200 and fake.received[-1].path == path_of(SONNET) and fake.received[-1].model == SONNET


def test_an_endpoint_and_region_of_its_own_are_used(monkeypatch: pytest.MonkeyPatch, fake: FakeProvider) -> None:
    other = FakeProvider(name="bedrock-ap-northeast-2", region="ap-northeast-2").start()
    try:
        status, _, _ = send(BedrockProvider(config(other, region="ap-northeast-2")), path_of(SONNET))
        assert status == 200 and signer(other) == f"{ACCESS_KEY}/ap-northeast-2/bedrock" and fake.received == []
        status, headers, _ = send(BedrockProvider(config(other, region="us-east-1")), path_of(SONNET))  # scoped to the wrong region
        assert status == 403 and headers["x-amzn-errortype"].startswith("InvalidSignatureException:")
    finally:
        other.stop()


def test_client_headers_and_query_never_reach_bedrock(fake: FakeProvider) -> None:
    client = {
        "authorization": "Bearer client-virtual-key",
        "x-api-key": "sk-client",
        "cookie": "session=1",
        "anthropic-beta": "tools-2024",
        "x-amz-security-token": "client-token",
        "x-amzn-bedrock-guardrailidentifier": "gr-policy",
        "x-amzn-bedrock-guardrailversion": "3",
    }
    status, _, _ = send(BedrockProvider(config(fake)), path_of(SONNET), headers=client, query="beta=true")
    received = fake.received[-1]
    assert status == 200 and "?" not in received.path
    assert received.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=" + ACCESS_KEY)
    assert not {"x-api-key", "cookie", "anthropic-beta", "x-amz-security-token"} & set(received.headers)
    signed = received.headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert received.headers["x-amzn-bedrock-guardrailidentifier"] == "gr-policy" and "x-amzn-bedrock-guardrailidentifier" in signed


def test_a_redirect_is_not_followed(fake: FakeProvider) -> None:
    fake.script(SONNET, Redirect("http://127.0.0.1:1/elsewhere"))
    status, _, _ = send(BedrockProvider(config(fake)), path_of(SONNET))
    assert status == 307 and len(fake.received) == 1


def test_a_large_body_is_signed_and_verified(fake: FakeProvider) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": [{"text": "x" * 400_000}]}]}).encode()  # over the offload threshold
    status, _, _ = send(BedrockProvider(config(fake)), path_of(SONNET), body=body)
    assert status == 200 and fake.received[-1].body == body


def test_expiring_credentials_are_refreshed_off_the_event_loop(fake: FakeProvider) -> None:
    fake.aws.keys["ASIAFAKESTALE0000001"] = AwsKey("stale-secret", token="stale-token")
    fake.aws.keys["ASIAFAKEFRESH0000001"] = AwsKey("fresh-secret", token="fresh-token")
    clock = [dt.datetime.now(dt.UTC)]
    refreshes: list[int] = []

    def refresh() -> dict[str, str]:
        refreshes.append(threading.get_ident())
        time.sleep(0.3)  # a slow STS or instance-metadata call
        expiry = clock[0] + dt.timedelta(hours=1)
        return {"access_key": "ASIAFAKEFRESH0000001", "secret_key": "fresh-secret", "token": "fresh-token", "expiry_time": expiry.isoformat()}

    credentials = RefreshableCredentials(
        "ASIAFAKESTALE0000001", "stale-secret", "stale-token", clock[0] + dt.timedelta(minutes=30), refresh, "test", time_fetcher=lambda: clock[0]
    )
    provider = BedrockProvider(config(fake), credentials)

    async def run() -> tuple[list[int], int, int]:
        ticks = 0
        first, _, _ = await _exchange(provider, path_of(SONNET), CONVERSE, None, "")
        clock[0] += dt.timedelta(minutes=25)  # five minutes left: botocore must refresh

        async def ticker(done: asyncio.Event) -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        done = asyncio.Event()
        ticking = asyncio.create_task(ticker(done))
        second, _, _ = await _exchange(provider, path_of(SONNET), CONVERSE, None, "")
        done.set()
        await ticking
        await provider.close()
        return [first, second], ticks, threading.get_ident()

    statuses, ticks, loop_thread = asyncio.run(run())
    assert statuses == [200, 200]
    assert [r.headers["x-amz-security-token"] for r in fake.received] == ["stale-token", "fresh-token"]
    assert len(refreshes) == 1 and refreshes[0] != loop_thread
    assert ticks >= 10  # the loop kept running through the 0.3 s refresh


def test_a_failed_refresh_fails_the_attempt_without_sending(fake: FakeProvider, caplog: pytest.LogCaptureFixture) -> None:
    def refresh() -> dict[str, str]:
        raise ConnectionError("sts.amazonaws.com unreachable")

    expired = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    provider = BedrockProvider(config(fake), RefreshableCredentials("ASIAFAKEGONE00000001", "gone", "gone", expired, refresh, "test"))
    with pytest.raises(UpstreamUnreachable) as failed:
        send(provider, path_of(SONNET))
    assert failed.value.reason == "credentials" and fake.received == []
    assert "provider bedrock-test: AWS credentials could not be refreshed (ConnectionError)" in caplog.messages
    botocore_said = [record for record in caplog.records if record.name == "botocore.credentials"]
    assert botocore_said and all(record.exc_info is None for record in botocore_said)  # its own warning, without the traceback


def test_a_provider_without_credentials_does_not_start(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match=r"providers\.bedrock-test: no AWS credentials found \(looked in: environment, shared config"):
        build_provider(config(fake))
    with pytest.raises(ConfigError, match=r"providers\.bedrock-test: AWS credentials could not be loaded \(ProfileNotFound\)"):
        build_provider(config(fake, profile="no-such-profile"))


def test_a_named_profile_signs_instead_of_the_environment(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("[gateway]\naws_access_key_id = AKIAFAKEPROFILE00001\naws_secret_access_key = profile-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    fake.aws.keys["AKIAFAKEPROFILE00001"] = AwsKey("profile-secret")
    status, _, _ = send(BedrockProvider(config(fake, profile="gateway")), path_of(SONNET))
    assert status == 200 and signer(fake) == "AKIAFAKEPROFILE00001/us-east-1/bedrock"


@pytest.mark.parametrize(
    ("model", "client", "protocol"),
    [
        (SONNET, "anthropic_messages", "bedrock_invoke"),
        (MODELS[1], "bedrock_invoke", "bedrock_invoke"),
        ("global.anthropic.claude-sonnet-4-20250514-v1:0", "anthropic_messages", "bedrock_invoke"),
        (MODELS[2], "anthropic_messages", "bedrock_invoke"),
        (MODELS[4], "anthropic_messages", "bedrock_converse"),  # an application profile does not say its model
        (SONNET, "openai_chat", "bedrock_converse"),
        (SONNET, "bedrock_converse", "bedrock_converse"),
        (SONNET, None, "bedrock_converse"),
        ("amazon.nova-pro-v1:0", "anthropic_messages", "bedrock_converse"),
        ("meta.llama3-70b-instruct-v1:0", "bedrock_invoke", "bedrock_converse"),
    ],
)
def test_invoke_for_anthropic_models_asked_in_messages_and_converse_otherwise(fake: FakeProvider, model: str, client: str | None, protocol: str) -> None:
    assert BedrockProvider(config(fake)).protocol_for(model, client) == protocol
