"""Errors as Bedrock Runtime renders them, for its clients (boto3, the AWS SDKs,
``AnthropicBedrock``): a JSON ``{"message": ...}`` body, the error type in the
``x-amzn-ErrorType`` header (botocore reads the code from it) and the request id in
``x-amzn-RequestId``; in a stream, an exception frame whose type is the same name in
lower camel case, as Bedrock writes them."""

from __future__ import annotations

import json

from portcullis.adapters.protocols.eventstream import exception_frame
from portcullis.engine.errors import ErrorKind, GatewayError

_TYPES = {
    ErrorKind.INVALID_REQUEST: "ValidationException",
    ErrorKind.AUTHENTICATION: "UnrecognizedClientException",
    ErrorKind.PAYMENT_REQUIRED: "ServiceQuotaExceededException",
    ErrorKind.PERMISSION: "AccessDeniedException",
    ErrorKind.NOT_FOUND: "ResourceNotFoundException",
    ErrorKind.METHOD_NOT_ALLOWED: "UnknownOperationException",
    ErrorKind.UPGRADE_REQUIRED: "UnknownOperationException",
    ErrorKind.REQUEST_TIMEOUT: "ValidationException",
    ErrorKind.REQUEST_TOO_LARGE: "ValidationException",
    ErrorKind.HEADERS_TOO_LARGE: "ValidationException",
    ErrorKind.RATE_LIMITED: "ThrottlingException",
    ErrorKind.INTERNAL: "InternalServerException",
    ErrorKind.UPSTREAM: "InternalServerException",
    ErrorKind.UNAVAILABLE: "ServiceUnavailableException",
    ErrorKind.TIMEOUT: "ModelTimeoutException",
}
# Codes that say more than the kind does.
_CODE_TYPES = {
    "invalid_signature": "InvalidSignatureException",
    "signature_expired": "InvalidSignatureException",
    "replayed_request": "InvalidSignatureException",
    "incomplete_signature": "IncompleteSignatureException",
    "unrecognized_client": "UnrecognizedClientException",
    "revoked_access_key": "UnrecognizedClientException",
    "presigned_not_supported": "AccessDeniedException",
    "sigv4_disabled": "AccessDeniedException",
    "unknown_route": "UnknownOperationException",
    "missing_api_key": "MissingAuthenticationTokenException",
}


# A guardrail trace carries the model's output as it was before the guardrail (and the
# text the guardrail matched) back to the client: past the gateway's own output guards
# and PII restore. No trace is asked for, and a client asking for one is told why.
NO_TRACE = "{where}: this gateway does not return guardrail traces; send it disabled"


def error_type(error: GatewayError) -> str:
    return _CODE_TYPES.get(error.code or "", _TYPES.get(error.kind, "InternalServerException"))


def error_status(error: GatewayError) -> int:
    """AWS answers a missing or unknown credential 403, not 401."""
    return 403 if error.kind is ErrorKind.AUTHENTICATION else error.kind.status


def error_body(error: GatewayError, request_id: str) -> bytes:
    return json.dumps({"message": error.message}).encode()


def error_headers(error: GatewayError, request_id: str) -> dict[str, str]:
    return {"x-amzn-ErrorType": error_type(error), "x-amzn-RequestId": request_id}


# The exceptions both streaming operations' event unions declare (ConverseStream's and
# InvokeModelWithResponseStream's): botocore reads a frame of any other type as an error
# with neither code nor message, so the client would lose why its stream ended.
_STREAM_TYPES = frozenset({"internalServerException", "modelStreamErrorException", "validationException", "throttlingException", "serviceUnavailableException"})
# A refusal of what the answer holds (an output guard's) is, to Bedrock, an answer that failed validation.
_STREAM_REFUSALS = frozenset({ErrorKind.PERMISSION, ErrorKind.INVALID_REQUEST})


def stream_error(error: GatewayError) -> bytes:
    """The exception frame that ends a stream the gateway cannot finish, of a type the
    stream's clients know."""
    name = error_type(error)
    if error.kind is ErrorKind.UPSTREAM:
        name = "ModelStreamErrorException"
    name = name[0].lower() + name[1:]
    if name not in _STREAM_TYPES:
        name = "validationException" if error.kind in _STREAM_REFUSALS else "internalServerException"
    return exception_frame(name, error.message)
