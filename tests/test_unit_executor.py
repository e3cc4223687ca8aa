"""The executor in process, no server: the pipeline's ordering and its failure paths.

Steps, providers and key pools are small recording doubles so each test can say what
ran, in which order, what went upstream and what the audit log holds; the bundle and
the Rego decision are real."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from portcullis.adapters import executor as executor_module
from portcullis.adapters.audit_log import AuditLog, AuditUnavailable
from portcullis.adapters.auth import Claim, Principal
from portcullis.adapters.dispatch import Dispatcher
from portcullis.adapters.executor import TOKEN_COUNT_HEADER, Executor
from portcullis.adapters.operations import Operation
from portcullis.adapters.pipeline import Admission, Exchange, Step
from portcullis.adapters.policy_input import decide
from portcullis.adapters.protocols.anthropic_messages import PROTOCOL as anthropic_messages
from portcullis.adapters.protocols.openai_chat import PROTOCOL as openai_chat
from portcullis.adapters.protocols.sse import SSEEvent, encode
from portcullis.adapters.providers.keys import ProviderKey
from portcullis.adapters.providers.mock import MockResponse
from portcullis.engine.activation import activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.errors import ErrorKind, GatewayError
from tests.asgi_requests import arrived_request
from tests.bundles import write_bundle

NOW = dt.datetime(2026, 6, 1, 12, tzinfo=dt.UTC)
BODY = b'{"model": "sonnet", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}'


def answer(text: str = "hi") -> bytes:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }
    return json.dumps(message).encode()


class ScriptedProvider:
    """Answers each send with the next scripted (status, parts); records what it got."""

    protocol = "anthropic_messages"

    def protocol_for(self, model: str, client: str | None) -> str | None:
        return self.protocol

    def __init__(self, name: str, *script: tuple[int, list[bytes]]) -> None:
        self.name = name
        self.script = list(script)
        self.sent: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []
        self.affinities: list[str | None] = []

    async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> MockResponse:
        self.sent.append((headers, body))
        self.paths.append(path)
        self.affinities.append(affinity)
        status, parts = self.script.pop(0) if self.script else (200, [answer()])
        return MockResponse(status, "application/json", parts)

    async def close(self) -> None:
        return None


class RecordingPool:
    def __init__(self, name: str) -> None:
        self.first = ProviderKey(f"{name}-key", "secret")
        self.taken: list[int] = []
        self.cooled: list[int | None] = []

    async def take(self, tokens: int) -> tuple[ProviderKey | None, int]:
        self.taken.append(tokens)
        return self.first, 0

    async def cool_down(self, key: ProviderKey, retry_after: int | None) -> None:
        self.cooled.append(retry_after)


class RecordingStep(Step[str]):
    """Admits with its name as state (or ``None``), editing the body or refusing as told."""

    def __init__(
        self,
        name: str,
        log: list[str],
        admission: dict[str, Any] | None = None,
        refuse: Exception | None = None,
        skip: bool = False,
        operations: frozenset[Operation] = frozenset({Operation.INFERENCE}),
    ) -> None:
        self.name, self.log = name, log
        self.admission, self.refuse, self.skip = admission or {}, refuse, skip
        self.operations = operations  # type: ignore[misc]  # a test's own choice per instance

    async def admit(self, exchange: Exchange) -> Admission[str] | None:
        self.log.append(f"admit {self.name}")
        if self.refuse is not None:
            raise self.refuse
        if self.skip:
            return None
        if self.admission.get("body_changed"):
            assert exchange.request is not None
            exchange.request.body["metadata"] = {"user_id": self.name}
        return Admission(self.name, **self.admission)

    async def settle(self, exchange: Exchange, state: str) -> None:
        self.log.append(f"settle {state} served={exchange.served is not None}")

    def outbound_headers(self, exchange: Exchange, state: str, provider: str) -> dict[str, str]:
        return {f"x-step-{state}": provider}

    def guards(self, exchange: Exchange, state: str, pair: Any) -> list[Any]:
        self.log.append(f"guards {state}")
        return [CountingGuard(self.log, state)]


class CountingGuard:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    async def document(self, document: dict[str, Any]) -> bool:
        self.log.append(f"guard {self.name}")
        return False

    async def events(self, events: Iterable[SSEEvent]) -> list[SSEEvent]:
        return list(events)

    async def finish(self) -> list[SSEEvent]:
        return []


class Authenticator:
    async def claim(self, http: Any) -> Claim:
        return Claim(Principal("key_0000000000000001", "eng", None))

    async def confirm(self, claim: Claim, http: Any, body: bytes) -> Principal:
        raise AssertionError("a key's claim is settled before the body is read")


class Bundles:
    def __init__(self, active: Any) -> None:
        self.active = active


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = write_bundle(tmp_path_factory.mktemp("bundle") / "b")
    return activate(parse_bundle(read_bundle_files(directory), []), ["anthropic-us", "anthropic-eu", "openai-main"], NOW.date())


class Harness:
    def __init__(self, tmp_path: Path, bundle: Any, steps: list[Step], us: ScriptedProvider, eu: ScriptedProvider, facts: tuple[Any, ...] = ()) -> None:
        self.providers = {"anthropic-us": us, "anthropic-eu": eu, "openai-main": ScriptedProvider("openai-main")}
        self.pools = {name: RecordingPool(name) for name in self.providers}
        self.audit = AuditLog(tmp_path / "audit.jsonl")
        dispatcher = Dispatcher(self.providers, self.pools, max_attempts=3, pooled=["anthropic-us"])  # type: ignore[arg-type]
        self.executor = Executor(Bundles(bundle), Authenticator(), dispatcher, self.audit, steps, 1 << 20, clock=lambda: NOW, facts=facts)  # type: ignore[arg-type]

    def run(self, body: bytes = BODY, operation: Operation = Operation.INFERENCE) -> Any:
        return asyncio.run(self.executor.handle(http_request(body), anthropic_messages, operation))

    def events(self) -> list[dict[str, Any]]:
        self.audit.close()
        return [json.loads(line) for line in self.audit.path.read_text().splitlines()]


def http_request(body: bytes) -> Request:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1)}
    return arrived_request(scope, body)


def test_steps_admit_in_order_and_every_admitted_step_settles_after_the_guards(tmp_path: Path, bundle: Any) -> None:
    log: list[str] = []
    steps = [RecordingStep("a", log), RecordingStep("b", log, skip=True), RecordingStep("c", log)]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    response = harness.run()
    assert response.status_code == 200
    # b returned no admission: it gets no guards and does not settle.
    assert log == ["admit a", "admit b", "admit c", "guards a", "guards c", "guard a", "guard c", "settle a served=True", "settle c served=True"]
    headers, _ = harness.providers["anthropic-us"].sent[0]
    assert headers["x-step-a"] == "anthropic-us" and headers["x-step-c"] == "anthropic-us" and "x-step-b" not in headers
    assert [event["event"] for event in harness.events()] == ["request_started", "request_finished"]


@pytest.fixture
def serialisations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies the executor serialises again, one entry per time."""
    calls: list[int] = []
    original = executor_module.serialised

    async def counted(body: dict[str, Any], size: int) -> bytes:
        calls.append(size)
        return await original(body, size)

    monkeypatch.setattr(executor_module, "serialised", counted)
    return calls


def test_an_untouched_body_goes_upstream_byte_identical(tmp_path: Path, bundle: Any, serialisations: list[int]) -> None:
    harness = Harness(tmp_path, bundle, [RecordingStep("a", [])], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    raw = BODY.replace(b'"sonnet"', b'"claude-sonnet-4-5-20250929"')  # the upstream's own name: nothing to swap
    harness.run(raw.replace(b"claude-sonnet-4-5-20250929", b"claude-sonnet-4-5"))
    _, sent = harness.providers["anthropic-us"].sent[0]
    assert sent == raw and serialisations == []  # spacing and member order as the client wrote them


def test_a_body_two_steps_edit_is_serialised_once(tmp_path: Path, bundle: Any, serialisations: list[int]) -> None:
    steps = [RecordingStep("a", [], {"body_changed": True}), RecordingStep("b", [], {"body_changed": True})]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    assert harness.run().status_code == 200
    _, sent = harness.providers["anthropic-us"].sent[0]
    assert len(serialisations) == 1 and json.loads(sent)["metadata"] == {"user_id": "b"}


def test_dispatch_facts_come_from_admissions(tmp_path: Path, bundle: Any) -> None:
    """Targets narrowed by a step are the only ones tried; a step's output cap lowers
    max_tokens to the target's ceiling; the bound tokens are what key capacity takes."""
    plan = decide(bundle, Principal("key_0000000000000001", "eng", None), anthropic_messages.wire.parse(BODY, {}))
    narrowed = plan.targets[1:]  # the second of sonnet's two regions, and its fallbacks
    assert narrowed and narrowed[0].provider == "anthropic-eu"
    steps = [RecordingStep("a", [], {"targets": narrowed}), RecordingStep("b", [], {"cap_output": True, "bound_tokens": 777})]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    ceiling = narrowed[0].max_output_tokens
    assert harness.run(BODY.replace(b'"max_tokens": 64', f'"max_tokens": {ceiling + 1000}'.encode())).status_code == 200
    assert harness.providers["anthropic-us"].sent == []
    _, sent = harness.providers["anthropic-eu"].sent[0]
    assert json.loads(sent)["max_tokens"] == ceiling
    assert harness.pools["anthropic-eu"].taken == [777]


def test_a_failing_target_fails_over_and_a_client_error_does_not(tmp_path: Path, bundle: Any) -> None:
    overloaded = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}).encode()
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us", (529, [overloaded])), ScriptedProvider("anthropic-eu"))
    assert harness.run().status_code == 200
    finished = harness.events()[-1]
    assert [attempt["outcome"] for attempt in finished["attempts"]] == ["status_529", "ok"]

    invalid = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}).encode()
    second = Harness(tmp_path / "2", bundle, [], ScriptedProvider("anthropic-us", (400, [invalid])), ScriptedProvider("anthropic-eu"))
    (tmp_path / "2").mkdir(exist_ok=True)
    response = second.run()
    assert response.status_code == 400 and second.providers["anthropic-eu"].sent == []
    assert second.events()[-1]["error"]["code"] == "upstream_invalid_request"


def test_a_rate_limited_key_cools_down_and_the_next_target_serves(tmp_path: Path, bundle: Any) -> None:
    limited = json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}).encode()

    class RateLimited(ScriptedProvider):
        async def send(self, path: str, query: str, headers: dict[str, str], body: bytes, affinity: str | None = None) -> MockResponse:
            response = await super().send(path, query, headers, body, affinity)
            response.headers = {"content-type": "application/json", "retry-after": "7"}
            return response

    harness = Harness(tmp_path, bundle, [], RateLimited("anthropic-us", (429, [limited])), ScriptedProvider("anthropic-eu"))
    assert harness.run().status_code == 200
    assert harness.pools["anthropic-us"].cooled == [7]


def test_a_refusing_step_stops_the_pipeline_and_earlier_steps_settle(tmp_path: Path, bundle: Any) -> None:
    log: list[str] = []
    refusal = GatewayError(ErrorKind.PAYMENT_REQUIRED, "budget exhausted", code="budget_exceeded")
    steps = [RecordingStep("a", log), RecordingStep("b", log, refuse=refusal), RecordingStep("c", log)]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    response = harness.run()
    assert response.status_code == 402 and response.headers["x-portcullis-error-code"] == "budget_exceeded"
    assert json.loads(response.body)["error"]["type"] == "billing_error"  # in the client's protocol
    assert log == ["admit a", "admit b", "settle a served=False"]
    assert harness.providers["anthropic-us"].sent == []
    (denied,) = harness.events()
    assert denied["event"] == "request_denied" and denied["stage"] == "admit" and denied["error"]["code"] == "budget_exceeded"


def test_a_step_that_breaks_is_an_internal_error_in_the_clients_protocol(tmp_path: Path, bundle: Any) -> None:
    steps = [RecordingStep("a", [], refuse=RuntimeError("bug"))]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    response = harness.run()
    assert response.status_code == 500 and json.loads(response.body)["error"]["type"] == "api_error"
    assert "bug" not in response.body.decode()
    assert harness.events()[0]["error"]["code"] == "internal_error"


def test_nothing_goes_upstream_unaudited(tmp_path: Path, bundle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    harness = Harness(tmp_path, bundle, [RecordingStep("a", log)], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))

    def unavailable(event: str, **fields: Any) -> None:
        raise AuditUnavailable("disk full")

    monkeypatch.setattr(harness.audit, "append_or_raise", unavailable)
    response = harness.run()
    assert response.status_code == 503 and response.headers["x-portcullis-error-code"] == "audit_unavailable"
    assert harness.providers["anthropic-us"].sent == [] and log == ["admit a", "settle a served=False"]


def test_a_stream_that_fails_before_its_first_event_fails_over(tmp_path: Path, bundle: Any) -> None:
    error_first = [encode({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, "error")]
    events = [
        encode({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 5, "output_tokens": 0}}}, "message_start"),
        encode({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}, "message_delta"),
        encode({"type": "message_stop"}, "message_stop"),
    ]
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us", (200, error_first)), ScriptedProvider("anthropic-eu", (200, events)))

    async def drain() -> bytes:
        stream = await harness.executor.handle(http_request(BODY.replace(b'"max_tokens"', b'"stream": true, "max_tokens"')), anthropic_messages)
        chunks = [stream._first]
        async for chunk in stream._body:
            chunks.append(chunk)
        return b"".join(chunks)

    relayed = asyncio.run(drain())
    assert b"message_stop" in relayed and b"overloaded" not in relayed
    finished = harness.events()[-1]
    assert finished["event"] == "request_finished"
    assert [attempt["outcome"] for attempt in finished["attempts"]] == ["error_event", "ok"]
    assert finished["usage"]["input"] == 5 and finished["usage"]["output"] == 3


# --- operations: each step runs only for the operations it names -------------------------------

COUNT_BODY = b'{"model": "sonnet", "messages": [{"role": "user", "content": "hello"}]}'
BOTH = frozenset({Operation.INFERENCE, Operation.COUNT_TOKENS})
COUNT_ONLY = frozenset({Operation.COUNT_TOKENS})


def test_a_count_runs_only_the_steps_that_apply_to_it_and_is_never_guarded(tmp_path: Path, bundle: Any) -> None:
    log: list[str] = []
    steps = [RecordingStep("filter", log, operations=BOTH), RecordingStep("billing", log), RecordingStep("limit", log, operations=COUNT_ONLY)]
    counted = json.dumps({"input_tokens": 42}).encode()
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us", (200, [counted])), ScriptedProvider("anthropic-eu"))
    response = harness.run(COUNT_BODY, Operation.COUNT_TOKENS)
    assert response.status_code == 200 and response.body == counted and response.headers[TOKEN_COUNT_HEADER] == "provider"
    assert log == ["admit filter", "admit limit", "settle filter served=False", "settle limit served=False"]
    us = harness.providers["anthropic-us"]
    assert us.paths == ["/v1/messages/count_tokens"] and json.loads(us.sent[0][1])["model"] == "claude-sonnet-4-5-20250929"
    headers, _ = us.sent[0]
    assert "x-step-filter" in headers and "x-step-billing" not in headers
    events = harness.events()
    assert [event["event"] for event in events] == ["request_started", "tokens_counted"]
    assert events[-1]["operation"] == "count_tokens" and events[-1]["input_tokens"] == 42 and "cost_micro_usd" not in events[-1]


def test_inference_never_runs_a_count_only_step(tmp_path: Path, bundle: Any) -> None:
    log: list[str] = []
    steps = [RecordingStep("limit", log, operations=COUNT_ONLY), RecordingStep("billing", log)]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    assert harness.run().status_code == 200
    assert log == ["admit billing", "guards billing", "guard billing", "settle billing served=True"]
    assert harness.providers["anthropic-us"].paths == ["/v1/messages"]
    assert "operation" not in harness.events()[0]  # inference records are as they always were


def test_a_count_no_target_can_make_is_estimated_and_labelled(tmp_path: Path, bundle: Any) -> None:
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    harness.providers["openai-main"].protocol = "openai_chat"
    response = harness.run(COUNT_BODY.replace(b'"sonnet"', b'"mini"'), Operation.COUNT_TOKENS)
    assert response.status_code == 200 and response.headers[TOKEN_COUNT_HEADER] == "estimate"
    assert json.loads(response.body)["input_tokens"] > 0
    assert all(provider.sent == [] for provider in harness.providers.values())
    assert harness.events()[-1]["count_method"] == "tiktoken:cl100k_base"


def test_each_operation_has_its_parser() -> None:
    assert anthropic_messages.parser(Operation.COUNT_TOKENS)(COUNT_BODY, {}, "", executor_module.DEFAULT_LIMITS).max_tokens is None
    with pytest.raises(GatewayError) as refused:  # inference still requires it
        anthropic_messages.parser(Operation.INFERENCE)(COUNT_BODY, {}, "", executor_module.DEFAULT_LIMITS)
    assert "max_tokens" in refused.value.message
    with pytest.raises(LookupError):  # a protocol without a count endpoint has no count operation
        openai_chat.parser(Operation.COUNT_TOKENS)


def test_a_count_refused_by_a_step_is_denied_with_its_operation(tmp_path: Path, bundle: Any) -> None:
    refusal = GatewayError(ErrorKind.RATE_LIMITED, "too many", code="count_tokens_rate_limited", retry_after=3)
    steps = [RecordingStep("limit", [], refuse=refusal, operations=COUNT_ONLY)]
    harness = Harness(tmp_path, bundle, steps, ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    response = harness.run(COUNT_BODY, Operation.COUNT_TOKENS)
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert json.loads(response.body)["error"]["type"] == "rate_limit_error"
    [denied] = harness.events()
    assert denied["event"] == "request_denied" and denied["operation"] == "count_tokens" and denied["stage"] == "admit"
