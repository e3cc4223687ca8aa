"""Every registered protocol satisfies the declared interfaces, member by member and
parameter by parameter; every pair of protocols has a route, which caps the output
only when told to; and outside the protocol and provider packages nothing names a
protocol."""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.protocols.interfaces import StreamConverter, StreamMeter, Surfaces, ToolCalls, ToolCallStream, Translator, Wire
from portcullis.adapters.protocols.registry import HUB, PROTOCOLS, TRANSLATORS, interface_members, route
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.adapters.protocols.sse import SSEEvent
from portcullis.adapters.protocols.translators.composed import Composed
from portcullis.engine.errors import GatewayError
from portcullis.engine.plan import Target

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"

# The callables an interface declares as attributes (classes), and the interface their
# instances satisfy.
_MADE = {"StreamUsage": StreamMeter, "ToolCallStream": ToolCallStream, "StreamConverter": StreamConverter}


def _methods(interface: type) -> dict[str, Callable[..., Any]]:
    return {name: value for name, value in vars(interface).items() if not name.startswith("_") and inspect.isfunction(value)}


def _parameters(function: Callable[..., Any]) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def _arity(interface: type, name: str) -> int:
    """How many arguments the interface's ``Callable[[...], X]`` attribute takes (names
    the annotation imports only for type checking stand for themselves)."""
    annotation = interface.__annotations__[name]
    names = {word: type(word, (), {}) for word in re.findall(r"[A-Za-z_]\w*", annotation) if not hasattr(builtins, word)}
    callable_type = eval(annotation, {**names, "Callable": typing.Callable})
    return len(typing.get_args(callable_type)[0])


def _satisfies(module: Any, interface: type) -> list[str]:
    """What ``module`` gets wrong about ``interface``: missing members, and callables
    whose parameters are not the interface's (isinstance checks only names)."""
    wrong = [f"{name}: missing" for name in interface_members(interface) if not hasattr(module, name)]
    for name, declared in _methods(interface).items():
        if hasattr(module, name) and _parameters(getattr(module, name)) != _parameters(declared):
            wrong.append(f"{name}{inspect.signature(getattr(module, name))} is not {name}{inspect.signature(declared)}")
    for name, made in _MADE.items():
        if name not in interface.__annotations__ or not hasattr(module, name):
            continue
        factory = getattr(module, name)
        if len(inspect.signature(factory).parameters) != _arity(interface, name):
            wrong.append(f"{name}{inspect.signature(factory)} does not take {_arity(interface, name)} arguments")
        for method, declared in _methods(made).items():
            if not hasattr(factory, method):
                wrong.append(f"{name}.{method}: missing")
            elif _parameters(getattr(factory, method)) != _parameters(declared):
                wrong.append(f"{name}.{method} is not {made.__name__}.{method}{inspect.signature(declared)}")
    return wrong


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_every_protocol_satisfies_wire_surfaces_and_tool_calls(name: str) -> None:
    entry = PROTOCOLS[name]
    assert entry.name == entry.wire.NAME == name
    for module, interface in ((entry.wire, Wire), (entry.surfaces, Surfaces), (entry.tools, ToolCalls)):
        assert isinstance(module, interface), f"{name}: {module.__name__} is not a {interface.__name__}"
        assert _satisfies(module, interface) == [], f"{name}: {module.__name__}"


@pytest.mark.parametrize("pair", sorted(TRANSLATORS))
def test_every_translator_satisfies_translator(pair: tuple[str, str]) -> None:
    translator = TRANSLATORS[pair]
    assert isinstance(translator, Translator)
    assert _satisfies(translator, Translator) == []
    assert translator.__name__.rsplit(".", 1)[1] == "_to_".join(pair)  # named after its pair


def test_the_checks_catch_a_missing_member_and_a_renamed_parameter() -> None:
    class Partial:
        NAME = "partial"

        @staticmethod
        def parse(body: bytes, headers: Any, query: str, limits: Any) -> None: ...

    assert not isinstance(Partial, Wire)
    wrong = _satisfies(Partial, Wire)
    assert "FRAMING: missing" in wrong and any(w.startswith("parse(body") for w in wrong)


def test_every_pair_of_registered_protocols_is_passed_through_translated_or_refused() -> None:
    for client in PROTOCOLS:
        for upstream in PROTOCOLS:
            served = route(client, upstream)
            assert (served.client.name, served.upstream.name) == (client, upstream)
            if client == upstream:
                assert served.translator is None and served.refusal is None
            elif (client, upstream) in TRANSLATORS:
                assert served.translator is TRANSLATORS[(client, upstream)] and served.refusal is None
            elif (client, HUB) in TRANSLATORS and (HUB, upstream) in TRANSLATORS:  # composed through the hub
                assert isinstance(served.translator, Composed) and served.refusal is None
                assert (served.translator.first, served.translator.second) == (TRANSLATORS[(client, HUB)], TRANSLATORS[(HUB, upstream)])
            else:  # no translator: a 400 for this target, so the dispatcher tries the next
                assert served.translator is None and client in served.refusal and upstream in served.refusal


@pytest.fixture
def without_chat_to_messages(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A registry where Chat clients cannot reach Messages providers (nor, through them, Bedrock)."""
    monkeypatch.delitem(TRANSLATORS, ("openai_chat", HUB))
    route.cache_clear()
    yield
    monkeypatch.undo()
    route.cache_clear()


def test_a_refused_pair_is_a_400_naming_both_protocols(without_chat_to_messages: None) -> None:
    refused = [(c, u) for c in PROTOCOLS for u in PROTOCOLS if c != u and route(c, u).refusal is not None]
    assert ("openai_chat", HUB) in refused and ("openai_chat", "bedrock_converse") in refused
    conversation = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
    samples = {
        "openai_responses": (b'{"model": "m", "input": "hi"}', {}),
        "bedrock_converse": (b'{"messages": [{"role": "user", "content": [{"text": "hi"}]}]}', {"model": "m", "action": "converse"}),
    }
    for client, upstream in refused:
        raw, path = samples.get(client, (conversation, {}))
        request = PROTOCOLS[client].wire.parse(raw, {}, "", DEFAULT_LIMITS, path)
        with pytest.raises(GatewayError) as refusal:
            route(client, upstream).upstream_body(request, CEILING_TARGET, cap_output=False)
        assert refusal.value.kind.status == 400 and "cannot be converted" in refusal.value.message


# Modules outside the protocol and provider packages that must still name protocols.
NAMING_ALLOWED = {
    "app.py": "binds each protocol's HTTP route (/v1/messages, /v1/chat/completions) to it",
    "http_edge.py": "answers requests that reach no route in the shape of the SDK family the path belongs to",
}
_PACKAGES = ("anthropic_messages", "bedrock_converse", "bedrock_invoke", "openai_chat", "openai_responses", "translators")


def _names_a_protocol(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found += [m for m in modules if any(m.startswith(f"portcullis.adapters.protocols.{p}") for p in _PACKAGES)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if any(a.name.startswith(f"portcullis.adapters.protocols.{p}") for p in _PACKAGES)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{word!r} at line {node.lineno}" for word in _PACKAGES[:-1] if word in node.value]
    return found


def test_nothing_outside_protocols_and_providers_names_a_protocol() -> None:
    offenders = {}
    for path in sorted(ADAPTERS.rglob("*.py")):
        relative = path.relative_to(ADAPTERS)
        if relative.parts[0] in ("protocols", "providers") or str(relative) in NAMING_ALLOWED:
            continue
        if found := _names_a_protocol(path):
            offenders[str(relative)] = found
    assert offenders == {}


def test_the_allowed_exceptions_still_need_to_be_allowed() -> None:
    for name in NAMING_ALLOWED:
        assert _names_a_protocol(ADAPTERS / name), f"{name} no longer names a protocol: drop it from NAMING_ALLOWED"


# --- routes: the output cap and the passthrough bytes ---------------------------------

CEILING_TARGET = Target("m", "p", "m", "us-east-1", 1, 200000, 1000, ("tools",))


def _body(name: str, raw: bytes, cap_output: bool, upstream: str | None = None) -> tuple[bytes, dict[str, Any]]:
    request = PROTOCOLS[name].wire.parse(raw, {}, "", DEFAULT_LIMITS)
    sent = route(name, upstream or name).upstream_body(request, CEILING_TARGET, cap_output)
    return sent, json.loads(sent)


def test_passthrough_bytes_are_the_clients_unless_the_output_must_be_capped() -> None:
    messages = b'{"model": "m",  "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}'
    assert _body("anthropic_messages", messages, cap_output=False)[0] == messages
    assert _body("anthropic_messages", messages, cap_output=True)[1]["max_tokens"] == 1000
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert _body("openai_chat", chat, cap_output=False)[0] == chat
    assert _body("openai_chat", chat, cap_output=True)[1]["max_completion_tokens"] == 1000
    legacy = b'{"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}'
    assert _body("openai_chat", legacy, cap_output=True)[1] == {"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}
    responses = b'{"model": "m",\n "input": [{"role": "user", "content": "h\\u00e9"}], "store": false}'
    assert _body("openai_responses", responses, cap_output=False)[0] == responses
    capped = _body("openai_responses", responses, cap_output=True)
    assert capped[1]["max_output_tokens"] == 1000 and capped[0].endswith(b'"model": "m",\n "input": [{"role": "user", "content": "h\\u00e9"}], "store": false}')


def test_a_translated_body_is_capped_in_the_providers_field() -> None:
    chat = b'{"model": "m", "max_completion_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}'
    assert _body("openai_chat", chat, cap_output=False, upstream="anthropic_messages")[1]["max_tokens"] == 5000
    assert _body("openai_chat", chat, cap_output=True, upstream="anthropic_messages")[1]["max_tokens"] == 1000
    messages = b'{"model": "m", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}'
    assert _body("anthropic_messages", messages, cap_output=True, upstream="openai_chat")[1]["max_completion_tokens"] == 1000


def test_the_usage_chunk_asked_for_a_chat_client_is_withheld_only_if_it_did_not_ask() -> None:
    usage = SSEEvent(None, '{"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}', b"data: usage\n\n")
    for options, forwarded in (({}, []), ({"stream_options": {"include_usage": True}}, [usage.raw])):
        raw = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], **options}).encode()
        request = PROTOCOLS["openai_chat"].wire.parse(raw, {}, "", DEFAULT_LIMITS)
        assert route("openai_chat", "openai_chat").stream_converter(request, 0).feed(usage) == forwarded
