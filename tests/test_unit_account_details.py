"""Provider error messages lose what identifies the operator's cloud account."""

from __future__ import annotations

import pytest

from portcullis.adapters.protocols.jsonbody import error_message
from portcullis.engine.account_details import without_account_details

ACCOUNT = "123456789012"


@pytest.mark.parametrize(
    "message",
    [
        f"User: arn:aws:sts::{ACCOUNT}:assumed-role/GatewayRole/i-0abc is not authorized to perform: bedrock:InvokeModel",
        f"on resource: arn:aws:bedrock:ap-northeast-2:{ACCOUNT}:inference-profile/apac.anthropic.claude-sonnet-4-5-20250929-v1:0",
        f"The security token included in the request is invalid for account {ACCOUNT}",
        "The request signature we calculated does not match. The Canonical String for this request should have been\nPOST\n/model/x\nhost:y",
        "Credential=AKIAIOSFODNN7EXAMPLE/20261201/us-east-1/bedrock/aws4_request, Signature=abc123",
        "access key ASIAIOSFODNN7EXAMPLE expired",
        "role/PortcullisBedrockAccess lacks bedrock:InvokeModel",
        f"Access denied for account {ACCOUNT}.",
        "Access denied for account 1234-5678-9012.",
    ],
)
def test_account_details_are_removed(message: str) -> None:
    cleaned = without_account_details(message)
    revealing = (ACCOUNT, "1234-5678-9012", "GatewayRole", "AKIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE", "host:y", "abc123", "PortcullisBedrockAccess")
    for secret in (*revealing, "arn:aws"):
        assert secret not in cleaned
    assert cleaned.strip()


def test_the_explanation_itself_stays() -> None:
    message = "messages.0.content: text must be non-empty; max_tokens 200000 exceeds 64000 (request 1234567890123)"
    assert without_account_details(message) == message  # 13 digits and ordinary numbers are not account ids


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"type": "invalid_request_error", "message": "bad"}}, "bad"),
        ({"message": "Malformed input request"}, "Malformed input request"),
        ({"Message": "Throttled"}, "Throttled"),
        ({"throttlingException": {"message": "slow down"}}, "slow down"),
        ({"type": "error"}, None),
        ([1], None),
    ],
)
def test_provider_error_messages_are_found_in_every_shape(body: object, message: str | None) -> None:
    assert error_message(body) == message
