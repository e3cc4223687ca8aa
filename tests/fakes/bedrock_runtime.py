"""Amazon Bedrock Runtime (``POST /model/{modelId}/converse``, ``/converse-stream``,
``/invoke``, ``/invoke-with-response-stream``): the SigV4 check (``sigv4``), the model
id from the path, Converse JSON and event streams, InvokeModel's Anthropic bodies and
their ``chunk`` frames, and AWS's errors.

As Bedrock does:
- every request is signed, or refused with a 403 before anything else is read;
- a Converse body is checked against the operation's members in botocore's service
  model; an InvokeModel body must carry ``anthropic_version`` and must not carry
  ``model`` or ``stream`` (the path names the model and the operation the streaming);
- errors are ``{"message": ...}`` with ``x-amzn-ErrorType`` (``Type:namespace``) and
  ``x-amzn-RequestId``, never 529 (a scripted 529 is answered 503), never with a
  retry-after; the messages of 400/403/404/424 name ARNs and the account id as AWS's do,
  so the gateway's sanitising has something to remove;
- a stream fails with an exception frame (``StreamError``) or is cut (``CutStream``);
  stream payloads carry AWS's ``p`` padding member, which clients ignore;
- a guardrail named by the request (``guardrailConfig``, or InvokeModel's guardrail
  headers) is recorded with it; ``Intervene`` makes it block: Converse answers
  ``stopReason: guardrail_intervened``, InvokeModel ``amazon-bedrock-guardrailAction:
  INTERVENED``.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from botocore.loaders import Loader
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from portcullis.adapters.protocols.eventstream import CONTENT_TYPE, event_frame, exception_frame
from tests.fakes.anthropic_messages import event_documents, message
from tests.fakes.behaviours import Behaviour, Fail, Intervene, Received, Redirect, Reply
from tests.fakes.sigv4 import Refusal, verify
from tests.fakes.wire import echoed, paced, reply_for, split

if TYPE_CHECKING:
    from tests.fakes.server import FakeProvider

PATH = "/model/{model:path}/converse"
ANTHROPIC_VERSION = "bedrock-2023-05-31"
GUARDRAIL_HEADERS = ("x-amzn-bedrock-guardrailidentifier", "x-amzn-bedrock-guardrailversion")
_PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
# Anthropic-style stream error names a test may script, as Bedrock's exception frames.
_STREAM_EXCEPTIONS = {"overloaded_error": "serviceUnavailableException", "rate_limit_error": "throttlingException", "api_error": "internalServerException"}

_STREAM_MESSAGES = {
    "serviceUnavailableException": "Bedrock is unable to process your request.",
    "throttlingException": "Too many requests, please wait before trying again.",
    "validationException": "The model returned a response that failed validation.",
}


@cache
def service_shapes() -> dict[str, Any]:
    """Bedrock Runtime's shapes, from the service model botocore ships."""
    return Loader().load_service_model("bedrock-runtime", "service-2")["shapes"]


def guardrail_of(received: Received) -> dict[str, Any] | None:
    """The guardrail a request named: Converse's ``guardrailConfig``, InvokeModel's headers."""
    if received.path.endswith(("/invoke", "/invoke-with-response-stream")):
        identifier, version = (received.headers.get(name) for name in GUARDRAIL_HEADERS)
        return {"guardrailIdentifier": identifier, "guardrailVersion": version} if identifier else None
    try:
        config = json.loads(received.body).get("guardrailConfig")
    except (ValueError, AttributeError):
        return None
    return config if isinstance(config, dict) else None


async def _received(fake: FakeProvider, request: Request, operation: str) -> tuple[str, dict[str, Any], Response | None]:
    """The request recorded (path as sent, model decoded from it) and its signature and
    JSON checked: (model, payload, None), or (model, {}, the error AWS answers)."""
    body = await request.body()
    raw_path = request.scope["raw_path"].decode("latin-1")
    query = request.scope.get("query_string", b"").decode("latin-1")
    model = unquote(raw_path.removeprefix("/model/").removesuffix(f"/{operation}"))
    headers = {name.lower(): value for name, value in request.headers.items()}
    fake.received.append(Received(raw_path + (f"?{query}" if query else ""), headers, body, model))
    verdict = verify(fake.aws, request.method, raw_path, query, headers, body) if fake.aws.verifies else None
    if isinstance(verdict, Refusal):
        return model, {}, error(verdict.status, verdict.message, verdict.error_type, namespace="com.amazon.coral.service")
    try:
        payload = json.loads(body)
    except ValueError:
        return model, {}, error(400, "Malformed input request, please reformat your input and try again.")
    if not isinstance(payload, dict):
        return model, {}, error(400, "Malformed input request: expected an object, please reformat your input and try again.")
    return model, payload, None


def _refused(fake: FakeProvider, model: str, behaviour: Behaviour) -> Response | None:
    if isinstance(behaviour, Redirect):
        return Response(status_code=307, headers={"location": behaviour.location})
    if isinstance(behaviour, Fail):
        return failure(fake, model, behaviour.status)
    return None


async def _turn(fake: FakeProvider, model: str, payload: dict[str, Any], guarded: bool) -> tuple[Behaviour, Reply, bool] | Response:
    """The behaviour queued for ``model`` and the reply it makes, and whether a guardrail
    intervened (an ``Intervene`` with a guardrail named: its message, no output); a
    redirect or failure answers at once. Converse and InvokeModel decide alike."""
    behaviour = fake.next_behaviour(model)
    if (answer := _refused(fake, model, behaviour)) is not None:
        return answer
    if isinstance(behaviour, Intervene) and guarded:
        return behaviour, Reply(text=behaviour.message, output_tokens=0), True
    return behaviour, echoed(await reply_for(behaviour), payload), False


# --- Converse ----------------------------------------------------------------------------


async def handle(fake: FakeProvider, request: Request) -> Response:
    return await _converse(fake, request, stream=False)


async def converse_stream(fake: FakeProvider, request: Request) -> Response:
    return await _converse(fake, request, stream=True)


async def _converse(fake: FakeProvider, request: Request, stream: bool) -> Response:
    started = time.monotonic()
    model, payload, refused = await _received(fake, request, "converse-stream" if stream else "converse")
    if refused is not None:
        return refused
    members = set(service_shapes()["ConverseStreamRequest" if stream else "ConverseRequest"]["members"]) - {"modelId"}
    unknown = sorted(set(payload) - members)
    if unknown:
        return error(400, f"Malformed input request: extraneous key [{unknown[0]}] is not permitted, please reformat your input and try again.")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages):
        return error(400, "1 validation error detected: Value at 'messages' failed to satisfy constraint: Member must not be null")
    guardrail = payload.get("guardrailConfig")
    if guardrail is not None and not (isinstance(guardrail, dict) and guardrail.get("guardrailIdentifier") and guardrail.get("guardrailVersion")):
        return error(400, "A guardrail identifier and version are both required.")
    turn = await _turn(fake, model, payload, guarded=guardrail is not None)
    if isinstance(turn, Response):
        return turn
    behaviour, reply, intervened = turn
    stop = "guardrail_intervened" if intervened else "tool_use" if reply.tool_calls else "end_turn"
    headers = {"x-amzn-requestid": str(uuid.uuid4())}
    if not stream:
        document = converse_document(reply, stop, _latency(started))
        return Response(json.dumps(document), 200, headers=headers, media_type="application/json")
    frames = converse_frames(reply, stop, _latency(started))
    return StreamingResponse(paced(frames, reply.event_delay, behaviour, _exception(fake, model)), headers=headers, media_type=CONTENT_TYPE)


def converse_usage(reply: Reply) -> dict[str, int]:
    usage = {"inputTokens": reply.input_tokens, "outputTokens": reply.output_tokens}
    usage["totalTokens"] = reply.input_tokens + reply.output_tokens + reply.cache_read_tokens + reply.cache_write_tokens
    if reply.cache_read_tokens:
        usage["cacheReadInputTokens"] = reply.cache_read_tokens
    if reply.cache_write_tokens:
        usage["cacheWriteInputTokens"] = reply.cache_write_tokens
    return usage


def converse_document(reply: Reply, stop: str, latency: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"reasoningContent": {"reasoningText": {"text": reply.reasoning, "signature": "fake-signature"}}})
    if reply.text:
        content.append({"text": reply.text})
    content += [{"toolUse": {"toolUseId": call.id, "name": call.name, "input": call.input}} for call in reply.tool_calls]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": converse_usage(reply),
        "metrics": {"latencyMs": latency},
    }


def converse_frames(reply: Reply, stop: str, latency: int) -> list[bytes]:
    """ConverseStream's frames: a text block has no start event; a tool call's start
    names it, its input comes as JSON text in pieces."""
    events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    index = 0
    if reply.reasoning:
        for piece in split(reply.reasoning, reply.pieces):
            events.append(("contentBlockDelta", {"delta": {"reasoningContent": {"text": piece}}, "contentBlockIndex": index}))
        events.append(("contentBlockDelta", {"delta": {"reasoningContent": {"signature": "fake-signature"}}, "contentBlockIndex": index}))
        events.append(("contentBlockStop", {"contentBlockIndex": index}))
        index += 1
    if reply.text:
        for piece in split(reply.text, reply.pieces):
            events.append(("contentBlockDelta", {"delta": {"text": piece}, "contentBlockIndex": index}))
        events.append(("contentBlockStop", {"contentBlockIndex": index}))
        index += 1
    for call in reply.tool_calls:
        events.append(("contentBlockStart", {"start": {"toolUse": {"toolUseId": call.id, "name": call.name}}, "contentBlockIndex": index}))
        for piece in split(json.dumps(call.input), reply.pieces):
            events.append(("contentBlockDelta", {"delta": {"toolUse": {"input": piece}}, "contentBlockIndex": index}))
        events.append(("contentBlockStop", {"contentBlockIndex": index}))
        index += 1
    events.append(("messageStop", {"stopReason": stop}))
    events.append(("metadata", {"usage": converse_usage(reply), "metrics": {"latencyMs": latency}}))
    return [event_frame(name, {**payload, "p": _PADDING[: 1 + i % len(_PADDING)]}) for i, (name, payload) in enumerate(events)]


# --- InvokeModel (Anthropic bodies) ----------------------------------------------------


async def invoke(fake: FakeProvider, request: Request) -> Response:
    return await _invoke(fake, request, stream=False)


async def invoke_stream(fake: FakeProvider, request: Request) -> Response:
    return await _invoke(fake, request, stream=True)


async def _invoke(fake: FakeProvider, request: Request, stream: bool) -> Response:
    started = time.monotonic()
    model, payload, refused = await _received(fake, request, "invoke-with-response-stream" if stream else "invoke")
    if refused is not None:
        return refused
    if problem := _anthropic_body_problem(payload):
        return error(400, f"Malformed input request: {problem}, please reformat your input and try again.")
    identifier, version = (request.headers.get(name) for name in GUARDRAIL_HEADERS)
    if identifier and not version:
        return error(400, "Guardrail version is required when a guardrail identifier is given.")
    turn = await _turn(fake, model, payload, guarded=identifier is not None)
    if isinstance(turn, Response):
        return turn
    behaviour, reply, intervened = turn
    extra = {"amazon-bedrock-guardrailAction": "INTERVENED" if intervened else "NONE"} if identifier else {}
    message_id = f"msg_bdrk_{uuid.uuid4().hex[:24]}"
    headers = {"x-amzn-requestid": str(uuid.uuid4())}
    if not stream:
        headers |= {
            "x-amzn-bedrock-input-token-count": str(reply.input_tokens),
            "x-amzn-bedrock-output-token-count": str(reply.output_tokens),
            "x-amzn-bedrock-invocation-latency": str(_latency(started)),
        }
        return Response(json.dumps({**message(message_id, model, reply), **extra}), 200, headers=headers, media_type="application/json")
    documents = event_documents(message_id, model, reply, ping=False)
    metrics = {"inputTokenCount": reply.input_tokens, "outputTokenCount": reply.output_tokens, "invocationLatency": _latency(started), "firstByteLatency": 1}
    documents[-1] = {**documents[-1], "amazon-bedrock-invocationMetrics": metrics, **extra}
    frames = [chunk_frame(document, i) for i, document in enumerate(documents)]
    headers["x-amzn-bedrock-content-type"] = "application/json"
    return StreamingResponse(paced(frames, reply.event_delay, behaviour, _exception(fake, model)), headers=headers, media_type=CONTENT_TYPE)


def _anthropic_body_problem(payload: dict[str, Any]) -> str | None:
    if "anthropic_version" not in payload:
        return "#: required key [anthropic_version] not found"
    if payload["anthropic_version"] != ANTHROPIC_VERSION:
        return f"#/anthropic_version: {payload['anthropic_version']!r} is not a supported version"
    for extraneous in ("model", "stream"):
        if extraneous in payload:
            return f"#: extraneous key [{extraneous}] is not permitted"
    for required in ("max_tokens", "messages"):
        if required not in payload:
            return f"#: required key [{required}] not found"
    return None


def chunk_frame(document: dict[str, Any], i: int = 0) -> bytes:
    """InvokeModel's stream frame: an Anthropic event, base64 in ``bytes``."""
    data = base64.b64encode(json.dumps(document).encode()).decode()
    return event_frame("chunk", {"bytes": data, "p": _PADDING[: 1 + i % len(_PADDING)]})


MORE_ROUTES = {
    "/model/{model:path}/converse-stream": converse_stream,
    "/model/{model:path}/invoke": invoke,
    "/model/{model:path}/invoke-with-response-stream": invoke_stream,
}


# --- errors ------------------------------------------------------------------------------


def error(status: int, message: str, error_type: str | None = None, namespace: str = "com.amazon.bedrock") -> Response:
    headers = {"x-amzn-ErrorType": f"{error_type or _TYPES.get(status, 'InternalServerException')}:http://internal.amazon.com/coral/{namespace}/"}
    headers["x-amzn-RequestId"] = str(uuid.uuid4())
    return Response(json.dumps({"message": message}), status, headers=headers, media_type="application/json")


def failure(fake: FakeProvider, model: str, status: int) -> Response:
    """A scripted failure as Bedrock words it (AWS names ARNs and the account in these)."""
    status = 503 if status == 529 else status
    account, region = fake.aws.account_id, fake.aws.region
    messages = {
        400: f"The provided model identifier is invalid: arn:aws:bedrock:{region}:{account}:inference-profile/{model}",
        403: (
            f"User: arn:aws:sts::{account}:assumed-role/PortcullisBedrock/gateway is not authorized to perform: bedrock:InvokeModel"
            f" on resource: arn:aws:bedrock:{region}::foundation-model/{model}"
        ),
        404: f"Model not found: arn:aws:bedrock:{region}:{account}:custom-model/{model}",
        424: f"Received error from arn:aws:bedrock:{region}::foundation-model/{model}: the model failed",
        429: "Too many requests, please wait before trying again.",
        503: "Bedrock is unable to process your request.",
    }
    return error(status, messages.get(status, "The system encountered an unexpected error during processing. Try your request again."))


def _exception(fake: FakeProvider, model: str) -> Any:
    def frame(kind: str) -> bytes:
        name = _STREAM_EXCEPTIONS.get(kind, kind)
        if name == "modelStreamErrorException":
            return exception_frame(name, f"Received error from arn:aws:bedrock:{fake.aws.region}::foundation-model/{model} while streaming")
        return exception_frame(name, _STREAM_MESSAGES.get(name, "The system encountered an unexpected error during processing. Try your request again."))

    return frame


def _latency(started: float) -> int:
    return int((time.monotonic() - started) * 1000) + 1
