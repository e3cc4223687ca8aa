"""The executor's routing inputs, in process: the affinity key a pool of pods hashes,
and the routing layers' fact sources (a failing one never fails the request; what the
plan decided is kept only once every step admitted it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from portcullis.adapters.pipeline import Admission, Exchange, FactSource, Step
from portcullis.engine.activation import activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.errors import ErrorKind, GatewayError
from tests.bundles import write_bundle
from tests.test_unit_executor import NOW, Harness, ScriptedProvider


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = write_bundle(tmp_path_factory.mktemp("bundle") / "b")
    return activate(parse_bundle(read_bundle_files(directory), []), ["anthropic-us", "anthropic-eu", "openai-main"], NOW.date())


def test_every_turn_of_a_conversation_reaches_the_provider_with_one_affinity_key(tmp_path: Path, bundle: Any) -> None:
    """The key a pool of pods hashes: the team, the tools, the first system texts and the
    first message, so later turns keep it and another conversation gets another."""
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    first = {"role": "user", "content": "refactor the parser"}
    turns = [[first], [first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "now the tests"}]]
    for messages in [*turns, [{"role": "user", "content": "another task"}]]:
        body = {"model": "sonnet", "max_tokens": 64, "system": "you are terse", "messages": messages}
        assert harness.run(json.dumps(body).encode()).status_code == 200
    keys = harness.providers["anthropic-us"].affinities
    assert len(keys) == 3 and all(isinstance(key, str) and len(key) == 32 for key in keys)
    assert keys[0] == keys[1] != keys[2]


def test_a_call_to_a_provider_without_a_pool_computes_no_affinity_key(tmp_path: Path, bundle: Any) -> None:
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"))
    body = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}  # anthropic-eu only
    assert harness.run(json.dumps(body).encode()).status_code == 200
    assert harness.providers["anthropic-eu"].affinities == [None]


class Recording(FactSource):
    name = "recorded"

    def __init__(self, log: list[str], fact: Any = None, fails: bool = False) -> None:
        self.log, self.fact, self.fails = log, fact, fails

    async def gather(self, exchange: Exchange) -> Any:
        self.log.append("gather")
        if self.fails:
            raise RuntimeError("the store said: secret prompt text")
        return self.fact

    async def decided(self, exchange: Exchange) -> None:
        self.log.append("decided")
        if self.fails:
            raise RuntimeError("secret prompt text")


class Refusing(Step[None]):
    async def admit(self, exchange: Exchange) -> Admission[None] | None:
        raise GatewayError(ErrorKind.INVALID_REQUEST, "too large for every target", code="context_length_exceeded")


def test_a_fact_source_that_raises_leaves_its_fact_out_and_the_request_is_served(tmp_path: Path, bundle: Any, caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    harness = Harness(tmp_path, bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"), facts=(Recording(log, fails=True),))
    with caplog.at_level(logging.ERROR):
        assert harness.run().status_code == 200
    assert log == ["gather", "decided"]
    assert "the recorded fact could not be gathered: RuntimeError" in caplog.text
    assert "secret" not in caplog.text  # the error's type, never its message


def test_what_the_plan_decided_is_kept_only_for_an_admitted_request(tmp_path: Path, bundle: Any) -> None:
    log: list[str] = []
    source = Recording(log, fact={"tier": "light"})
    refused = Harness(tmp_path / "a", bundle, [Refusing()], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"), facts=(source,))
    assert refused.run().status_code == 400
    assert log == ["gather"]  # refused by a step: no pin is written for it
    served = Harness(tmp_path / "b", bundle, [], ScriptedProvider("anthropic-us"), ScriptedProvider("anthropic-eu"), facts=(source,))
    assert served.run().status_code == 200
    assert log == ["gather", "gather", "decided"]
