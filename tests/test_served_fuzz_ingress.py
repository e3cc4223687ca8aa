"""Seeded fuzzing of every ingress protocol through a real gateway process.

Every field the gateway reads gets every wrong JSON type; valid bodies are cut short at
random points; framing is broken (encodings, duplicates, escapes); bodies are made huge,
deep and over every count cap; forwarded headers are oversized. Each case must come back
as a 4xx in the protocol's own error shape, with an error code and a request id, and
the gateway must log no traceback. The valid bodies themselves must be served (200), so
the fuzzing cannot pass by refusing everything.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bundles import CATALOG, TENANTS, deep_copy, target, write_bundle
from tests.conftest import Fakes, gateway_config

pytestmark = pytest.mark.served

SEED = 20261201
LIMITS = {"max_request_bytes": 262144, "max_messages": 40, "max_tools": 16, "max_content_blocks": 60, "max_nesting_depth": 32, "max_header_bytes": 4096}

ANTHROPIC_BASE: dict[str, Any] = {
    "model": "haiku",
    "max_tokens": 16,
    "stream": False,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "metadata": {"user_id": "user-1"},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "thinking": {"type": "disabled"},
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},  # unknown to the gateway: passed through
    "output_config": {"effort": "low"},
    "tools": [{"name": "bash", "description": "Runs a command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
    "tool_choice": {"type": "auto"},
    "messages": [
        {"role": "system", "content": "Claude Code sends system turns inside messages."},
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Listing."}, {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.txt"}], "is_error": False},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            ],
        },
    ],
}

OPENAI_BASE: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "Be terse.", "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ],
    "max_completion_tokens": 16,
    "stream": False,
    "n": 1,
    "temperature": 0.5,
    "top_p": 1,
    "stop": ["END"],
    "user": "user-1",
    "metadata": {"team": "eng"},
    "tools": [{"type": "function", "function": {"name": "bash", "description": "Runs a command.", "parameters": {"type": "object", "properties": {}}}}],
    "tool_choice": "auto",
    "response_format": {"type": "text"},
    "reasoning_effort": "low",  # unknown to the gateway: passed through
}

RESPONSES_BASE: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "Be terse.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: read-only"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAAAB=="},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "bash", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"},
    ],
    "max_output_tokens": 16,
    "stream": False,
    "temperature": 0.5,
    "top_p": 1,
    "user": "user-1",
    "metadata": {"team": "eng"},
    "tools": [
        {"type": "function", "name": "bash", "description": "Runs a command.", "parameters": {"type": "object", "properties": {}}},
        {"type": "custom", "name": "apply_patch", "description": "Patches.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "text"}},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "service_tier_hint": "x",  # unknown to the gateway: passed through
}

STR, INT, NUM, BOOL, LIST, DICT = str, "int", "number", bool, list, dict
# (path, accepted kinds, required): every field the ingress validators read.
ANTHROPIC_FIELDS: list[tuple[tuple[Any, ...], tuple[Any, ...], bool]] = [
    (("model",), (STR,), True),
    (("max_tokens",), (INT,), True),
    (("stream",), (BOOL,), False),
    (("messages",), (LIST,), True),
    (("system",), (STR, LIST), False),
    (("system", 0), (DICT,), True),
    (("system", 0, "type"), (STR,), True),
    (("system", 0, "text"), (STR,), True),
    (("metadata",), (DICT,), False),
    (("metadata", "user_id"), (STR,), False),
    (("stop_sequences",), (LIST,), False),
    (("stop_sequences", 0), (STR,), True),
    (("temperature",), (NUM,), False),
    (("top_p",), (NUM,), False),
    (("top_k",), (NUM,), False),
    (("thinking",), (DICT,), False),
    (("thinking", "type"), (STR,), False),
    (("tools",), (LIST,), False),
    (("tools", 0), (DICT,), True),
    (("tools", 0, "name"), (STR,), False),
    (("tools", 0, "description"), (STR,), False),
    (("tools", 0, "input_schema"), (DICT,), False),
    (("tools", 0, "type"), (STR,), False),
    (("tool_choice",), (DICT,), False),
    (("tool_choice", "type"), (STR,), True),
    (("tool_choice", "name"), (STR,), False),
    (("mcp_servers",), (LIST,), False),
    (("messages", 0), (DICT,), True),
    (("messages", 0, "role"), (STR,), True),
    (("messages", 0, "content"), (STR, LIST), True),
    (("messages", 1, "role"), (STR,), True),
    (("messages", 1, "content"), (STR, LIST), True),
    (("messages", 1, "content", 0), (DICT,), True),
    (("messages", 1, "content", 0, "type"), (STR,), True),
    (("messages", 1, "content", 0, "text"), (STR,), True),
    (("messages", 1, "content", 0, "citations"), (LIST,), False),
    (("messages", 2, "content", 1, "id"), (STR,), False),
    (("messages", 2, "content", 1, "name"), (STR,), False),
    (("messages", 3, "content", 0, "tool_use_id"), (STR,), False),
    (("messages", 3, "content", 0, "is_error"), (BOOL,), False),
    (("messages", 3, "content", 0, "content"), (STR, LIST), False),
    (("messages", 3, "content", 0, "content", 0), (DICT,), True),
    (("messages", 3, "content", 0, "content", 0, "type"), (STR,), True),
    (("messages", 3, "content", 0, "content", 0, "text"), (STR,), True),
    (("messages", 3, "content", 1, "source"), (DICT,), False),
]
OPENAI_FIELDS: list[tuple[tuple[Any, ...], tuple[Any, ...], bool]] = [
    (("model",), (STR,), True),
    (("messages",), (LIST,), True),
    (("stream",), (BOOL,), False),
    (("max_completion_tokens",), (INT,), False),
    (("max_tokens",), (INT,), False),
    (("n",), (INT,), False),
    (("temperature",), (NUM,), False),
    (("top_p",), (NUM,), False),
    (("presence_penalty",), (NUM,), False),
    (("stop",), (STR, LIST), False),
    (("stop", 0), (STR,), True),
    (("user",), (STR,), False),
    (("metadata",), (DICT,), False),
    (("stream_options",), (DICT,), False),
    (("stream_options", "include_usage"), (BOOL,), False),
    (("tools",), (LIST,), False),
    (("tools", 0), (DICT,), True),
    (("tools", 0, "type"), (STR,), False),
    (("tools", 0, "function"), (DICT,), False),
    (("tools", 0, "function", "name"), (STR,), False),
    (("tools", 0, "function", "description"), (STR,), False),
    (("tools", 0, "function", "parameters"), (DICT,), False),
    (("tool_choice",), (STR, DICT), False),
    (("response_format",), (DICT,), False),
    (("response_format", "type"), (STR,), False),
    (("functions",), (LIST,), False),
    (("messages", 0), (DICT,), True),
    (("messages", 0, "role"), (STR,), True),
    (("messages", 0, "content"), (STR, LIST), False),
    (("messages", 0, "name"), (STR,), False),
    (("messages", 1, "role"), (STR,), True),
    (("messages", 1, "content", 0), (DICT,), True),
    (("messages", 1, "content", 0, "type"), (STR,), True),
    (("messages", 1, "content", 0, "text"), (STR,), True),
    (("messages", 1, "content", 1, "image_url"), (DICT,), False),
    (("messages", 1, "content", 1, "image_url", "url"), (STR,), False),
    (("messages", 2, "tool_calls"), (LIST,), False),
    (("messages", 2, "tool_calls", 0), (DICT,), True),
    (("messages", 2, "tool_calls", 0, "id"), (STR,), False),
    (("messages", 2, "tool_calls", 0, "type"), (STR,), False),
    (("messages", 2, "tool_calls", 0, "function"), (DICT,), False),
    (("messages", 2, "tool_calls", 0, "function", "name"), (STR,), False),
    (("messages", 2, "tool_calls", 0, "function", "arguments"), (STR,), False),
    (("messages", 2, "function_call"), (DICT,), False),
    (("messages", 3, "tool_call_id"), (STR,), False),
    (("messages", 3, "refusal"), (STR,), False),
]

RESPONSES_FIELDS: list[tuple[tuple[Any, ...], tuple[Any, ...], bool]] = [
    (("model",), (STR,), True),
    (("input",), (STR, LIST), True),
    (("instructions",), (STR,), False),
    (("stream",), (BOOL,), False),
    (("max_output_tokens",), (INT,), False),
    (("temperature",), (NUM,), False),
    (("top_p",), (NUM,), False),
    (("user",), (STR,), False),
    (("metadata",), (DICT,), False),
    (("store",), (BOOL,), False),
    (("parallel_tool_calls",), (BOOL,), False),
    (("include",), (LIST,), False),
    (("include", 0), (STR,), True),
    (("prompt_cache_key",), (STR,), False),
    (("reasoning",), (DICT,), False),
    (("reasoning", "effort"), (STR,), False),
    (("text",), (DICT,), False),
    (("text", "format"), (DICT,), False),
    (("text", "format", "type"), (STR,), False),
    (("tools",), (LIST,), False),
    (("tools", 0), (DICT,), True),
    (("tools", 0, "type"), (STR,), False),
    (("tools", 0, "name"), (STR,), False),
    (("tools", 0, "description"), (STR,), False),
    (("tools", 0, "parameters"), (DICT,), False),
    (("tools", 1, "format"), (DICT,), False),
    (("tool_choice",), (STR, DICT), False),
    (("input", 0), (DICT,), True),
    (("input", 0, "type"), (STR,), False),
    (("input", 0, "role"), (STR,), True),
    (("input", 0, "content"), (STR, LIST), False),
    (("input", 1, "content", 0), (DICT,), True),
    (("input", 1, "content", 0, "type"), (STR,), True),
    (("input", 1, "content", 0, "text"), (STR,), True),
    (("input", 1, "content", 1, "image_url"), (STR,), False),
    (("input", 2, "summary"), (LIST,), False),
    (("input", 2, "summary", 0), (DICT,), True),
    (("input", 2, "encrypted_content"), (STR,), False),
    (("input", 3, "call_id"), (STR,), False),
    (("input", 3, "name"), (STR,), False),
    (("input", 3, "arguments"), (STR,), False),
    (("input", 4, "output"), (STR, LIST), False),
    (("input", 5, "input"), (STR,), False),
]

WRONG_VALUES: list[Any] = [None, True, False, 0, -3, 2.5, "x", "", [], ["x"], [1, {"a": None}], {}, {"k": "v"}]


def accepts(kinds: tuple[Any, ...], value: Any, required: bool, path: tuple[Any, ...]) -> bool:
    if value is None:
        return not required
    if isinstance(value, bool):
        return BOOL in kinds
    if isinstance(value, int):
        positive = path[-1] not in ("max_tokens", "max_completion_tokens", "max_output_tokens", "n") or value > 0
        return (INT in kinds and positive) or NUM in kinds
    if isinstance(value, float):
        return NUM in kinds
    if isinstance(value, str):
        return STR in kinds and (value != "" or path[-1] not in ("model",))
    return type(value) in kinds


def put(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    node: Any = body
    for step in path[:-1]:
        node = node.setdefault(step, {}) if isinstance(step, str) else node[step]  # a missing object member is created
    node[path[-1]] = value
    return body


@dataclass(frozen=True)
class Case:
    name: str
    protocol: str  # "anthropic" | "openai" | "responses"
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def wrong_type_cases(protocol: str, base: dict[str, Any], fields: list[tuple[tuple[Any, ...], tuple[Any, ...], bool]]) -> list[Case]:
    cases = []
    for path, kinds, required in fields:
        for value in WRONG_VALUES:
            if accepts(kinds, value, required, path):
                continue
            where = ".".join(str(step) for step in path)
            cases.append(Case(f"{protocol}:{where}={json.dumps(value)}", protocol, json.dumps(put(base, path, value)).encode()))
    return cases


def truncated_cases(protocol: str, base: dict[str, Any], rng: random.Random, count: int) -> list[Case]:
    raw = json.dumps(base).encode()
    cuts = sorted(rng.sample(range(len(raw) - 1), count))  # a proper prefix of an object is never a whole object
    return [Case(f"{protocol}:cut@{cut}", protocol, raw[:cut]) for cut in cuts]


def framing_cases(protocol: str, base: dict[str, Any], rng: random.Random) -> list[Case]:
    raw = json.dumps(base).encode()
    text = raw.decode()
    deep_schema = {"type": "object"}
    for _ in range(40):
        deep_schema = {"type": "object", "properties": {"x": deep_schema}}
    tool = {"name": "deep", "description": "d", "input_schema": deep_schema}
    if protocol == "openai":
        tool = {"type": "function", "function": {"name": "deep", "parameters": deep_schema}}
    elif protocol == "responses":
        tool = {"type": "function", "name": "deep", "parameters": deep_schema}
    conversation = "input" if protocol == "responses" else "messages"
    many_tools = [copy.deepcopy(base["tools"][0]) for _ in range(LIMITS["max_tools"] + 1)]
    many_messages = [{"role": "user", "content": "x"}] * (LIMITS["max_messages"] + 1)
    many_blocks = [{"type": "input_text" if protocol == "responses" else "text", "text": "x"}] * (LIMITS["max_content_blocks"] + 1)
    bodies = {
        "empty": b"",
        "whitespace": b" \n\t ",
        "null": b"null",
        "array": b"[]",
        "string": b'"hello"',
        "number": b"42",
        "utf16": text.encode("utf-16"),
        "utf32": text.encode("utf-32"),
        "latin1-bytes": raw.replace(b"terse", b"ters\xe9"),
        "bom": b"\xef\xbb\xbf" + raw,
        "nul-byte": raw.replace(b"{", b"{\x00", 1),
        "duplicate-model": raw.replace(b"{", b'{"model": "other", ', 1),
        "escaped-duplicate": raw.replace(b"{", b'{"mod\\u0065l": "other", ', 1),
        "lone-surrogate": raw.replace(b'"user-1"', b'"\\ud83d"', 1),
        "nan": raw.replace(b'"temperature": 0.5', b'"temperature": NaN', 1),
        "trailing-comma": raw[:-1] + b",}",
        "trailing-garbage": raw + b"}",
        "two-documents": raw + raw,
        "single-quotes": raw.replace(b'"', b"'"),
        "long-number": raw.replace(b'"temperature": 0.5', b'"temperature": ' + b"9" * 5000, 1),
        "deep-5000": raw[:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "deep-900": raw[:-1] + b', "x": ' + b"[" * 900 + b"]" * 900 + b"}",
        "deep-schema": json.dumps(put(base, ("tools",), [tool])).encode(),
        "deep-in-message": json.dumps(put(base, ("metadata",), json.loads("[" * 40 + "]" * 40))).encode(),
        "huge-declared": raw[:-1] + b', "pad": "' + b"x" * (LIMITS["max_request_bytes"] + 10) + b'"}',
        "too-many-tools": json.dumps(put(base, ("tools",), many_tools)).encode(),
        "too-many-messages": json.dumps(put(base, (conversation,), many_messages)).encode(),
        "too-many-blocks": json.dumps(put(base, (conversation,), [{"role": "user", "content": many_blocks}])).encode(),
        "random-bytes": bytes(rng.randrange(256) for _ in range(512)),
    }
    cases = [Case(f"{protocol}:{name}", protocol, body) for name, body in bodies.items()]
    if protocol == "anthropic":
        cases.append(Case("anthropic:huge-beta-header", protocol, raw, (("anthropic-beta", "b" * (LIMITS["max_header_bytes"] + 1)),)))
        cases.append(Case("anthropic:no-max-tokens", protocol, json.dumps({k: v for k, v in base.items() if k != "max_tokens"}).encode()))
    elif protocol == "responses":
        cases.append(Case("responses:no-input", protocol, json.dumps({k: v for k, v in base.items() if k != "input"}).encode()))
        cases.append(Case("responses:previous-response-id", protocol, json.dumps({**base, "previous_response_id": "resp_1"}).encode()))
        for depth in (40, 900, 5000):
            deep = put(base, ("input", 3, "arguments"), "[" * depth + "]" * depth)
            cases.append(Case(f"responses:deep-arguments-{depth}", protocol, json.dumps(deep).encode()))
    else:
        cases.append(Case("openai:no-messages", protocol, json.dumps(put(base, ("messages",), [])).encode()))
        for depth in (40, 900, 5000):  # JSON inside a string the filters parse and walk
            deep = put(base, ("messages", 2, "tool_calls", 0, "function", "arguments"), "[" * depth + "]" * depth)
            cases.append(Case(f"openai:deep-arguments-{depth}", protocol, json.dumps(deep).encode()))
    return cases


def all_cases() -> list[Case]:
    rng = random.Random(SEED)
    cases: list[Case] = []
    protocols = (("anthropic", ANTHROPIC_BASE, ANTHROPIC_FIELDS), ("openai", OPENAI_BASE, OPENAI_FIELDS), ("responses", RESPONSES_BASE, RESPONSES_FIELDS))
    for protocol, base, fields in protocols:
        cases += wrong_type_cases(protocol, base, fields)
        cases += truncated_cases(protocol, base, rng, 160)
        cases += framing_cases(protocol, base, rng)
    return cases


def shape_problem(protocol: str, response: httpx.Response) -> str | None:
    """What is wrong with a refusal, or None: a 4xx, in the protocol's error shape, with
    a code, a request id and a short message."""
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code}"
    if not response.headers.get("x-portcullis-request-id") or not response.headers.get("x-portcullis-error-code"):
        return "missing request id or error code header"
    try:
        document = response.json()
    except ValueError:
        return "body is not JSON"
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "no error object with type and message"
    if protocol == "anthropic" and (document.get("type") != "error" or not isinstance(error.get("code"), str)):
        return "not the Anthropic envelope with a code"
    if protocol in ("openai", "responses") and "code" not in error:
        return "no OpenAI code member"
    if len(error["message"]) > 400:
        return f"message of {len(error['message'])} characters"
    return None


async def run_cases(url: str, key: str, cases: list[Case], concurrency: int = 8) -> list[tuple[Case, httpx.Response]]:
    paths = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions", "responses": "/v1/responses"}
    bearer = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    anthropic = {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    base_headers = {"anthropic": anthropic, "openai": bearer, "responses": bearer}
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, case: Case) -> tuple[Case, httpx.Response]:
        async with gate:
            headers = {**base_headers[case.protocol], **dict(case.headers)}
            return case, await client.post(f"{url}{paths[case.protocol]}", content=case.body, headers=headers)

    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(one(client, case) for case in cases))


@pytest.fixture
def fuzz_gateway(fresh_gateway: Any, tmp_path: Path, fakes: Fakes) -> Any:
    # The Responses base goes to a provider that speaks Responses (the fake's /v1/responses).
    catalog = deep_copy(CATALOG)
    catalog["models"]["gpt-5-codex"] = {"targets": [target("openai-responses", "gpt-5-codex", "us-east-1")]}
    price = {"input": "1", "output": "1"}
    catalog["prices"].append({"provider": "openai-responses", "model": "gpt-5-codex", "effective_from": "2025-01-01", "usd_per_mtok": price})
    bundle = write_bundle(tmp_path / "fuzz-bundle", deep_copy(TENANTS), catalog)
    providers = gateway_config(tmp_path, fakes, bundle)["providers"]
    return fresh_gateway(bundle=bundle, limits=LIMITS, providers=[*providers, {**providers[-1], "name": "openai-responses", "wire": "responses"}])


def test_the_corpus_is_large_seeded_and_covers_every_protocol() -> None:
    cases = all_cases()
    assert len(cases) >= 1000
    assert [c.body for c in cases] == [c.body for c in all_cases()]  # deterministic
    assert {c.protocol for c in cases} == {"anthropic", "openai", "responses"}


def test_valid_bodies_are_served_untouched(fuzz_gateway: Any, fakes: Fakes) -> None:
    # The control: the bases pass (unknown-but-valid fields included) and go upstream byte for byte.
    results = asyncio.run(
        run_cases(
            fuzz_gateway.url,
            fuzz_gateway.key("eng"),
            [
                Case("anthropic:base", "anthropic", json.dumps(ANTHROPIC_BASE).encode()),
                Case("openai:base", "openai", json.dumps(OPENAI_BASE).encode()),
                Case("responses:base", "responses", json.dumps(RESPONSES_BASE).encode()),
            ],
        )
    )
    for case, response in results:
        assert response.status_code == 200, (case.name, response.text)
    sent = json.loads(fakes.anthropic_eu.received[-1].body)
    assert {k: v for k, v in sent.items() if k != "model"} == {k: v for k, v in ANTHROPIC_BASE.items() if k != "model"}
    [chat] = [r for r in fakes.openai_main.received if r.path == "/v1/chat/completions"]
    assert json.loads(chat.body)["reasoning_effort"] == "low"
    [responses] = [r for r in fakes.openai_main.received if r.path == "/v1/responses"]
    assert responses.body == json.dumps(RESPONSES_BASE).encode()


def test_every_hostile_request_is_a_4xx_in_the_protocols_shape(fuzz_gateway: Any, fakes: Fakes) -> None:
    cases = all_cases()
    results = asyncio.run(run_cases(fuzz_gateway.url, fuzz_gateway.key("eng"), cases))
    problems = [(case.name, problem, response.text[:200]) for case, response in results if (problem := shape_problem(case.protocol, response))]
    assert not problems, f"{len(problems)} of {len(cases)} cases failed, e.g. {problems[:5]}"
    codes = {response.headers["x-portcullis-error-code"] for _, response in results}
    assert {"invalid_request", "body_too_large", "nesting_too_deep", "too_many_tools", "too_many_messages", "too_many_content_blocks"} <= codes
    assert "header_too_large" in codes
    assert not any(fake.received for fake in fakes.all())  # refused at ingress, every one
    logs = fuzz_gateway.logs()
    assert "Traceback" not in logs and "unexpected" not in logs
    assert httpx.get(f"{fuzz_gateway.url}/healthz").status_code == 200
