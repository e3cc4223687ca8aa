"""The real clients' signatures over real HTTP: boto3's ``bedrock-runtime`` and
``AnthropicBedrock`` sign with an issued credential and call a small uvicorn app whose
only job is the gateway's ``Authenticator`` (claim, read the body, confirm). It checks
what the clients actually sign (boto3's header set, AnthropicBedrock's raw ``:`` and
its many signed headers) before the Bedrock routes exist."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import botocore.config
import botocore.exceptions
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from portcullis.adapters.auth import Authenticator
from portcullis.adapters.aws_credentials import SealKeys, create_aws_credential
from portcullis.adapters.protocols import aws_errors
from portcullis.adapters.store import Store
from portcullis.engine.errors import GatewayError
from tests.fakes import free_port
from tests.sigv4_helpers import bedrock_client, embedded_store

SEAL = SealKeys([b"k" * 32])
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0"
CONVERSE_ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "verified"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
    "metrics": {"latencyMs": 1},
}
MESSAGES_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "verified"}],
    "model": "m",
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


class Verifier:
    """A uvicorn server that answers a request only once its signature verified."""

    def __init__(self, store: Store) -> None:
        self.auth = Authenticator(store, 0, seal=SEAL)
        self.paths: list[bytes] = []
        self.principals: list[str] = []
        app = Starlette(routes=[Route("/model/{rest:path}", self.handle, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="off"))
        self.url = f"http://127.0.0.1:{self.server.config.port}"

    async def handle(self, request: Request) -> Response:
        try:
            claim = await self.auth.claim(request)
            principal = await self.auth.confirm(claim, request, await request.body())
        except GatewayError as error:
            return Response(aws_errors.error_body(error, "r"), error.kind.status, headers=aws_errors.error_headers(error, "r"))
        self.paths.append(request.scope["raw_path"])
        self.principals.append(principal.key_id)
        return JSONResponse(CONVERSE_ANSWER if request.url.path.endswith("/converse") else MESSAGES_ANSWER)

    def __enter__(self) -> Verifier:
        threading.Thread(target=self.server.run, daemon=True).start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the verifying server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield from embedded_store(tmp_path)


@pytest.fixture
def credential(store: Store) -> tuple[str, str]:
    record, secret = asyncio.run(create_aws_credential(store, SEAL, "eng", None, None))
    return record.key_id, secret


@pytest.fixture
def verifier(store: Store) -> Iterator[Verifier]:
    with Verifier(store) as running:
        yield running


def bedrock(verifier: Verifier, credential: tuple[str, str]) -> Any:
    return bedrock_client(verifier.url, credential, "eu-central-1")


MESSAGES = [{"role": "user", "content": [{"text": "hello"}]}]


@pytest.mark.parametrize("model", ["anthropic.claude-3-5-sonnet-20240620-v1:0", ARN])
def test_boto3_converse_and_invoke_signatures_verify(verifier: Verifier, credential: tuple[str, str], model: str) -> None:
    client = bedrock(verifier, credential)
    assert client.converse(modelId=model, messages=MESSAGES)["output"]["message"]["content"][0]["text"] == "verified"
    client.invoke_model(modelId=model, body=b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}')
    assert verifier.principals == [credential[0]] * 2
    assert all(b"%3A" in path for path in verifier.paths)  # boto3 percent-encodes; the signature covered that
    assert model != ARN or all(b"%2F" in path for path in verifier.paths)


def test_boto3_sees_aws_error_codes(verifier: Verifier, credential: tuple[str, str]) -> None:
    for wrong, code in (((credential[0], "w" * 40), "InvalidSignatureException"), (("PCAKAAAAAAAAAAAAAAAA", credential[1]), "UnrecognizedClientException")):
        with pytest.raises(botocore.exceptions.ClientError) as failed:
            bedrock(verifier, wrong).converse(modelId="m", messages=MESSAGES)
        assert failed.value.response["Error"]["Code"] == code
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert credential[1] not in str(failed.value)
    assert verifier.principals == []


def test_anthropic_bedrock_signatures_over_raw_colons_verify(verifier: Verifier, credential: tuple[str, str]) -> None:
    client = anthropic.AnthropicBedrock(
        aws_access_key=credential[0], aws_secret_key=credential[1], aws_region="us-west-2", base_url=verifier.url, max_retries=0
    )
    for model in ("anthropic.claude-3-5-sonnet-20240620-v1:0", ARN):
        message = client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "hello"}])
        assert message.content[0].text == "verified"  # type: ignore[union-attr]
    assert verifier.principals == [credential[0]] * 2
    assert any(b":" in path for path in verifier.paths)


def test_anthropic_bedrock_with_a_wrong_secret_is_refused(verifier: Verifier, credential: tuple[str, str]) -> None:
    client = anthropic.AnthropicBedrock(aws_access_key=credential[0], aws_secret_key="w" * 40, aws_region="us-west-2", base_url=verifier.url, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as failed:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hello"}])
    assert failed.value.response.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
