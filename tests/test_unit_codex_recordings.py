"""The Codex CLI recordings in tests/data/codex/ and the recording server that made them.

The recordings are golden inputs for the Responses parser: these tests pin what they
show (see tests/data/codex/README.md), so a re-recording that changes it is noticed,
and check that the recorder's streams are valid Responses events.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from portcullis.adapters.protocols.openai_responses import PROTOCOL as RESPONSES
from portcullis.adapters.protocols.request import DEFAULT_LIMITS

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "codex"
SCENARIOS = sorted(path.stem for path in DATA.glob("*.json"))
# The last two input items of each scenario's last POST, as Codex sent them.
LAST_ITEMS = {
    "shell": ["function_call", "function_call_output"],
    "patch": ["custom_tool_call", "custom_tool_call_output"],
    "tool-search": ["tool_search_call", "tool_search_output"],
    "compaction-remote": ["message", "compaction"],
}


def recording(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def posts(name: str) -> list[dict[str, Any]]:
    return [request["body"] for request in recording(name)["requests"] if request["method"] == "POST"]


def test_every_scenario_is_described() -> None:
    readme = (DATA / "README.md").read_text()
    assert len(SCENARIOS) == 10
    assert all(f"`{name}.json`" in readme for name in SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_recordings_hold_codex_requests_without_secrets(name: str) -> None:
    document = recording(name)
    assert document["codex_version"] == "0.171.0" and document["scenario"] == name
    for request in document["requests"]:
        assert request["headers"].get("authorization", "Bearer <redacted").startswith("Bearer <redacted")
    for body in posts(name):
        assert body["stream"] is True and body["store"] is False and "previous_response_id" not in body
        assert isinstance(body["input"], list) and body["input"][0]["role"] == "developer"


@pytest.mark.parametrize("name", sorted(LAST_ITEMS))
def test_tool_rounds_replay_the_call_with_its_output(name: str) -> None:
    last = posts(name)[-1]["input"]
    assert [item["type"] for item in last[-2:]] == LAST_ITEMS[name]
    if name != "compaction-remote":
        assert last[-1]["call_id"] == last[-2]["call_id"]


def test_tools_codex_declares() -> None:
    known = [(tool["type"], tool.get("name")) for tool in posts("text")[0]["tools"]]
    assert ("custom", "apply_patch") in known and ("function", "exec_command") in known
    assert ("tool_search", None) in known and ("web_search", None) in known
    fallback = [(tool["type"], tool.get("name")) for tool in posts("fallback-model")[0]["tools"]]
    assert ("namespace", "multi_agent_v1") in fallback and ("custom", "apply_patch") not in fallback


def test_compaction_goes_through_responses() -> None:
    local, remote = recording("compaction-local")["requests"], recording("compaction-remote")["requests"]
    assert {request["path"] for request in local + remote} == {"/v1/responses"}
    assert posts("compaction-local")[1]["tools"] == []
    assert posts("compaction-remote")[1]["input"][-1] == {"type": "compaction_trigger"}


def _recorder() -> Any:
    spec = importlib.util.spec_from_file_location("record_client", ROOT / "scripts" / "record_client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scenario", ["text", "shell", "patch", "tool-search", "compaction"])
def test_recorder_streams_are_valid_responses_events(scenario: str) -> None:
    recorder = _recorder()
    body = posts("text")[0]
    if scenario == "compaction":
        body, scenario = {**body, "input": [*body["input"], {"type": "compaction_trigger"}]}, "text"
    args = argparse.Namespace(scenario=scenario, command="echo hi", input_tokens=10)
    chunks = [chunk.decode() for chunk in recorder.responses_answer(body, args, "session", set())]
    events = [json.loads(chunk.split("data: ", 1)[1]) for chunk in chunks]
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


@pytest.mark.parametrize("name", [name for name in SCENARIOS if posts(name)])
def test_the_gateway_parses_every_request_codex_sent(name: str) -> None:
    """Each recorded POST /v1/responses body, byte for byte as Codex sent it, is a request
    the gateway's Responses parser admits (nothing Codex sends is refused as malformed),
    and every string the provider will read is visited by the surfaces walk."""
    for body in posts(name):
        raw = json.dumps(body, ensure_ascii=False).encode()
        parsed = RESPONSES.wire.parse(raw, {}, "", DEFAULT_LIMITS)
        assert parsed.model == body["model"] and parsed.stream is True
        seen = _visited(parsed.body)
        users = [item for item in body["input"] if item.get("role") == "user"]
        texts = [part["text"] for item in users for part in item.get("content", []) if isinstance(part, dict) and "text" in part]
        assert texts and all(text in seen for text in texts)


def _visited(body: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    RESPONSES.surfaces.visit_prompt(body, lambda surface, text: seen.append(text) or text)
    return seen
