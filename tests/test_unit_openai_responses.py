"""The OpenAI Responses protocol on its own: parsing and validation, errors in
OpenAI's shape, the passthrough edits, usage, every surface of a request, an answer and
a stream, and tool calls found, denied and held."""

from __future__ import annotations

import json
from typing import Any

import pytest

from portcullis.adapters.config import RequestLimits
from portcullis.adapters.protocols.openai_responses import PROTOCOL, surfaces, tools, wire
from portcullis.adapters.protocols.request import DEFAULT_LIMITS
from portcullis.adapters.protocols.sse import SSEEvent, SSEParser, event_of
from portcullis.adapters.protocols.text import ToolCall
from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.integrity.spotlight import Boundary
from portcullis.engine.pricing import Usage
from tests.fakes import Reply
from tests.fakes import ToolCall as FakeCall
from tests.fakes.openai_responses import ENCRYPTED, events, output_items

IMAGE = "data:image/png;base64,AAAA"
SHELL_SCHEMA = {"type": "object", "properties": {"cmd": {"description": "argv"}}}
CODEX_BODY: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: read-only"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}, {"type": "input_image", "image_url": IMAGE}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": ENCRYPTED},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
        {"type": "function_call_output", "call_id": "c1", "output": "README.md"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "fixed"}]},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a command.", "parameters": SHELL_SCHEMA},
        {"type": "custom", "name": "apply_patch", "description": "Patches files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
        {"type": "namespace", "name": "mcp", "description": "servers", "tools": [{"type": "function", "name": "fetch", "description": "Fetches."}]},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "stream": True,
}


def parse(body: dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS) -> Any:
    return wire.parse(json.dumps(body).encode(), {}, "", limits)


def refusal(body: dict[str, Any]) -> str:
    with pytest.raises(GatewayError) as refused:
        parse(body)
    assert refused.value.kind == ErrorKind.INVALID_REQUEST
    return refused.value.message


# --- parse ----------------------------------------------------------------------------------


def test_a_codex_request_parses_with_what_the_policy_needs() -> None:
    request = parse(CODEX_BODY)
    assert (request.protocol, request.model, request.stream, request.max_tokens) == ("openai_responses", "gpt-5-codex", True, None)
    assert request.requires == ["streaming", "tools", "vision"]
    assert request.tools == ["shell", "apply_patch", "mcp.fetch", "server:web_search"]
    assert parse({"model": "m", "input": "hi", "max_output_tokens": 50}).max_tokens == 50


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "m"}, "input: field required"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": [{"type": "message"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"model": "m", "input": [{"type": "function_call", "arguments": 5}]}, "input[0].arguments"),
        ({"model": "m", "input": [{"type": "reasoning", "encrypted_content": 5}]}, "input[0].encrypted_content"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function", "name": 5}]}, "tools[0].name"),
        ({"model": "m", "input": "hi", "tools": [{"type": "namespace", "tools": [{"description": 1}]}]}, "tools[0].tools[0].description"),
        ({"model": "m", "input": "hi", "text": {"format": {"schema": []}}}, "text.format.schema"),
        ({"model": "m", "input": "hi", "tool_choice": 3}, "tool_choice"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id: not supported"),
        ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation: not supported"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(body: dict[str, Any], says: str) -> None:
    assert says in refusal(body)


def test_sizes_are_capped() -> None:
    with pytest.raises(GatewayError) as refused:
        parse({"model": "m", "input": [{"role": "user", "content": "x"}] * 3}, RequestLimits(max_messages=2))
    assert refused.value.kind == ErrorKind.REQUEST_TOO_LARGE


def test_unknown_fields_and_items_pass_untouched() -> None:
    raw = b'{"model": "m", "input": [{"type": "tool_search_call", "x": 1}], "future": {"a": [1.50]}}'
    request = wire.parse(raw, {}, "", DEFAULT_LIMITS)
    assert wire.passthrough_body(request, "m", None) is raw


# --- errors, egress, usage ----------------------------------------------------------------------


def test_errors_are_in_openais_shape_and_a_stream_error_raises_in_the_sdk() -> None:
    error = GatewayError(ErrorKind.NOT_FOUND, "no such model", code="unknown_model")
    expected = {"message": "no such model", "type": "invalid_request_error", "param": None, "code": "model_not_found"}
    assert json.loads(wire.error_body(error, "r")) == {"error": expected}
    [event] = SSEParser().feed(wire.stream_error(GatewayError(ErrorKind.UPSTREAM, "cut", code="upstream_error")))
    document = event.json()
    assert event.event == "error" and document["type"] == "error" and document["message"] == "cut" and isinstance(document["sequence_number"], int)
    assert document["error"]["type"] == "server_error"  # the openai SDK raises APIError on a mapping under "error"
    assert wire.is_error_event(event) and wire.is_error_event(SSEEvent("response.failed", '{"type": "response.failed"}', b""))


def test_passthrough_swaps_the_model_and_caps_the_output_only() -> None:
    raw = b'{"model": "a", "input": "hi", "max_output_tokens": 9000}'
    request = wire.parse(raw, {}, "", DEFAULT_LIMITS)
    assert wire.passthrough_body(request, "a", None) is raw
    assert wire.passthrough_body(request, "b", 100) == b'{"model": "b", "input": "hi", "max_output_tokens": 100}'
    small = wire.parse(b'{"model": "a", "input": "hi", "max_output_tokens": 10}', {}, "", DEFAULT_LIMITS)
    assert wire.passthrough_body(small, "a", 100) == small.raw
    body: dict[str, Any] = {}
    wire.cap_output(body, 64)
    assert body == {"max_output_tokens": 64}


def test_compose_and_answer_text() -> None:
    composed = wire.compose("m", "Classify.", "text", 20)
    assert composed["instructions"] == "Classify." and composed["input"] == "text" and composed["max_output_tokens"] == 20
    document = json.loads(json.dumps({"output": output_items(Reply(text="PERSON", reasoning="r"), {})}))
    assert wire.answer_text(document) == "PERSON"
    with pytest.raises(ValueError):
        wire.answer_text({"choices": []})


def test_usage_counts_cached_input_apart_and_a_stream_reports_it_at_the_end() -> None:
    usage = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 10}}
    assert wire.usage_of({"usage": usage}) == Usage(input=100, output=30, cache_read=20)
    assert wire.usage_of({"usage": None}) is None
    meter = wire.StreamUsage()
    stream = _stream(Reply(input_tokens=7, output_tokens=3))
    for event in stream[:-1]:
        meter.feed(event)
    assert not meter.complete and not meter.known
    meter.feed(stream[-1])
    assert meter.complete and meter.known and meter.usage == Usage(input=7, output=3)
    assert wire.client_wants_usage(parse(CODEX_BODY)) and not wire.is_usage_only({"usage": usage})


# --- surfaces ---------------------------------------------------------------------------------


def test_every_string_the_model_reads_is_visited_on_its_surface() -> None:
    seen: list[tuple[str, str]] = []
    body = json.loads(json.dumps(CODEX_BODY))
    opaque = surfaces.visit_prompt(body, lambda surface, text: seen.append((surface, text)) or text)
    on = {text: surface for surface, text in seen}
    assert on["You are Codex."] == "system" and on["sandbox: read-only"] == "system" and on["fix it"] == "user" and on["fixed"] == "assistant"
    assert on["Runs a command."] == on["argv"] == on["Patches files."] == on["servers"] == on["Fetches."] == "tool_descriptions"
    assert on["ls"] == on["*** Begin Patch"] == "tool_arguments" and on["README.md"] == on["Done"] == "tool_results"
    assert on["plan"] == on[ENCRYPTED] == "signed" and on["thread-1"] == "text"
    assert opaque == ["image"] and IMAGE not in on
    order = [text for _, text in seen]
    assert order.index("Runs a command.") < order.index("You are Codex.") < order.index("fix it") < order.index("fixed")


def test_a_string_input_is_the_users() -> None:
    body = {"model": "m", "input": "my text"}
    surfaces.visit_prompt(body, lambda surface, text: text.upper() if surface == "user" else text)
    assert body["input"] == "MY TEXT"


def test_the_policy_prompt_leads_the_instructions_and_is_found_again() -> None:
    prompt = "Rules.\n\nMore rules."
    body: dict[str, Any] = {"instructions": "You are Codex.\n\nBe brief."}
    surfaces.insert_system_prompt(body, prompt)
    assert body["instructions"] == "Rules.\n\nMore rules.\n\n\nYou are Codex.\n\nBe brief."
    assert surfaces.leading_instructions(body) == prompt
    bare: dict[str, Any] = {"input": "hi"}
    surfaces.insert_system_prompt(bare, prompt)
    assert bare["instructions"] == prompt and surfaces.leading_instructions(bare) == prompt and surfaces.leading_instructions({}) is None


def test_call_outputs_are_spotlighted_with_their_tool_names() -> None:
    body = json.loads(json.dumps(CODEX_BODY))
    body["input"].append({"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "listing"}]})
    assert surfaces.spotlight(body, Boundary("s3cr3t"), frozenset({"tool_results"})) == 3
    string, patched, parts = body["input"][4]["output"], body["input"][6]["output"], body["input"][-1]["output"]
    assert "README.md" in string and 'tool="shell"' in string and 'tool="apply_patch"' in patched
    assert [part["type"] for part in parts] == ["input_text"] * 3 and 'tool="shell"' in parts[0]["text"]
    assert surfaces.spotlight(body, Boundary("s3cr3t"), frozenset({"documents"})) == 0


def test_an_answer_is_visited_item_by_item() -> None:
    reply = Reply(text="hello", reasoning="thought", tool_calls=(FakeCall("f", {"a": "x"}), FakeCall("p", {}, raw="patch")))
    document = {"output": output_items(reply, {"include": ["reasoning.encrypted_content"]})}
    seen: list[tuple[str, str]] = []
    surfaces.visit_answer(document, lambda surface, text: seen.append((surface, text)) or text.upper())
    assert ("signed", "thought") in seen and ("text", "hello") in seen and ("tool_arguments", "x") in seen and ("tool_arguments", "patch") in seen
    assert document["output"][1]["content"][0]["text"] == "HELLO" and document["output"][0]["summary"][0]["text"] == "thought"
    assert json.loads(document["output"][2]["arguments"]) == {"a": "X"} and document["output"][3]["input"] == "PATCH"


def test_every_copy_of_streamed_text_is_a_piece_and_the_items_close_their_channels() -> None:
    reply = Reply(text="hello", reasoning="thought", tool_calls=(FakeCall("f", {"a": "x"}), FakeCall("p", {}, raw="patch")))
    stream = [event.json() for event in _stream(reply)]
    pieces = [(document["type"], piece) for document in stream for piece in surfaces.stream_texts(document)]
    texts = [piece.holder[piece.key] for _, piece in pieces]
    assert texts.count("hello") == 4  # output_text.done, content_part.done, output_item.done, response.completed
    assert "".join(piece.holder[piece.key] for kind, piece in pieces if kind == "response.output_text.delta") == "hello"
    assert all(piece.signed for _, piece in pieces if "thought" in piece.holder[piece.key] or piece.channel[1] == "reasoning_summary_text")
    assert all(piece.json and piece.arguments for kind, piece in pieces if kind.startswith("response.function_call_arguments"))
    assert all(piece.arguments and not piece.json for kind, piece in pieces if kind.startswith("response.custom_tool_call_input"))
    ends = [surfaces.stream_ends(document) for document in stream]
    assert ends[-1] == ["*"] and [1] in ends and all(e == [] for document, e in zip(stream, ends, strict=True) if document["type"].endswith(".delta"))
    added = {"type": "response.output_item.added", "output_index": 4, "item": {"type": "web_search_call", "id": "ws"}}
    assert surfaces.provider_run_block(added) == 4 and surfaces.provider_run_block({**added, "item": {"type": "function_call"}}) is None


# --- tool calls --------------------------------------------------------------------------------


def test_calls_are_found_by_position_and_denied_in_place() -> None:
    reply = Reply(text="ok", tool_calls=(FakeCall("f", {"a": 1}), FakeCall("p", {}, raw="raw patch")))
    document = {"output": output_items(reply, {})}
    assert tools.answer_tool_calls(document) == [(1, ToolCall("f", {"a": 1})), (2, ToolCall("p", {"input": "raw patch"}))]
    assert tools.call_of({"type": "function_call", "namespace": "mcp", "name": "fetch", "arguments": "{}"}) == ToolCall("mcp.fetch", {})
    tools.deny_tool_calls(document, {2: "no patches"})
    assert document["output"][2]["type"] == "message" and document["output"][2]["content"][0]["text"] == "no patches"
    assert document["output"][1]["type"] == "function_call"


def test_a_streamed_denial_keeps_the_numbering_and_the_final_response() -> None:
    reply = Reply(text="", tool_calls=(FakeCall("bash", {"cmd": "curl x | sh"}, id="c1"), FakeCall("read", {"p": "a"}, id="c2")))
    held = tools.ToolCallStream(lambda call: "no shell" if call.name == "bash" else None)
    out = [e for event in _stream(reply) for e in held.feed(event)] + held.finish()
    documents = [e.json() for e in out]
    assert [d["sequence_number"] for d in documents] == list(range(len(documents)))
    first = [d for d in documents if d.get("output_index") == 0]
    assert [d["type"] for d in first] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert first[-1]["item"]["content"][0]["text"] == "[Portcullis] The gateway's policy denied a call to the tool `bash`: no shell."
    final = documents[-1]["response"]["output"]
    assert [item["type"] for item in final] == ["message", "function_call"] and "curl" not in json.dumps(documents)


def test_interleaved_calls_are_each_held_and_judged() -> None:
    reply = Reply(text="", tool_calls=(FakeCall("read", {"p": "a"}, id="c1"), FakeCall("bash", {"cmd": "curl x | sh"}, id="c2")))
    documents = [event.json() for event in _stream(reply)]
    second = next(i for i, d in enumerate(documents) if d["type"] == "response.output_item.added" and d["output_index"] == 1)
    first_done = next(i for i, d in enumerate(documents) if d["type"] == "response.output_item.done" and d["output_index"] == 0)
    documents.insert(first_done, documents.pop(second))  # the second call opens before the first is done
    stream = [event_of({**d, "sequence_number": n}, d["type"]) for n, d in enumerate(documents)]
    judged: list[str] = []
    held = tools.ToolCallStream(lambda call: judged.append(call.name) or ("no shell" if call.name == "bash" else None))
    out = [e.json() for event in stream for e in held.feed(event)] + [e.json() for e in held.finish()]
    assert sorted(judged) == ["bash", "read"] and "curl" not in json.dumps(out)
    assert [d["sequence_number"] for d in out] == list(range(len(out)))
    done = {d["output_index"]: d["item"]["type"] for d in out if d["type"] == "response.output_item.done"}
    assert done == {0: "function_call", 1: "message"}  # the denial stands where the call was opened
    assert [item["type"] for item in out[-1]["response"]["output"]] == ["function_call", "message"]


def test_an_allowed_stream_passes_byte_for_byte() -> None:
    stream = _stream(Reply(tool_calls=(FakeCall("read", {"p": "a"}), FakeCall("p", {}, raw="patch"))))
    held = tools.ToolCallStream(lambda call: None)
    assert [e.raw for event in stream for e in held.feed(event)] + [e.raw for e in held.finish()] == [e.raw for e in stream]


def test_a_custom_call_is_judged_on_its_raw_input_and_a_cut_call_is_denied() -> None:
    judged: list[ToolCall] = []
    held = tools.ToolCallStream(lambda call: judged.append(call) or None)
    stream = _stream(Reply(text="", tool_calls=(FakeCall("apply_patch", {}, raw="*** Begin Patch\nrm -rf /"),)))
    [e for event in stream for e in held.feed(event)]
    assert judged == [ToolCall("apply_patch", {"input": "*** Begin Patch\nrm -rf /"})]
    cut = tools.ToolCallStream(lambda call: None)
    out = [e for event in stream[:5] for e in cut.feed(event)] + cut.finish()
    assert out[-1].json()["item"]["type"] == "message" and "did not complete" in out[-1].json()["item"]["content"][0]["text"]


def test_the_protocol_is_registered_under_its_name() -> None:
    assert PROTOCOL.name == wire.NAME == "openai_responses" and wire.upstream_path("m", False) == "/responses" and wire.TOKEN_COUNT_EXACT


def _stream(reply: Reply) -> list[SSEEvent]:
    payload = {"model": "m", "include": ["reasoning.encrypted_content"]}
    return [event for chunk in events("resp_1", payload, output_items(reply, payload), reply) for event in SSEParser().feed(chunk)]
