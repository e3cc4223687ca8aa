"""What the intent router reads of a request: the client from its User-Agent, the
bundle's keyword sets matched in the task's text, and every feature measured the same
way, through ``Exchange.conversation()``, whatever protocol the client speaks."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest

from portcullis.adapters.auth import Principal
from portcullis.adapters.intent.features import FeatureSource
from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.pipeline import Exchange
from portcullis.adapters.protocols.registry import protocol
from portcullis.adapters.protocols.request import ParsedRequest
from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.clients import client_of
from portcullis.engine.intent_features import bucket, has_code
from portcullis.engine.intent_keywords import MAX_CHARS, KeywordError, KeywordMatcher
from tests.intent_helpers import write_intent_bundle
from tests.test_unit_conversation import PROTOCOLS, first_and_second_turns

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}


@pytest.mark.parametrize(
    ("user_agent", "client"),
    [
        ("claude-cli/2.1.197 (external, cli)", "claude-code"),
        ("codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown (codex_exec; 0.171.0)", "codex"),
        ("codex_cli_rs/0.171.0 (Debian 12.0.0; x86_64) unknown", "codex"),
        ("opencode/1.18.2 ai-sdk/anthropic/2.0.1", "opencode"),
        ("Anthropic/Python 0.69.0", "anthropic-sdk"),
        ("Anthropic/JS 0.60.0", "anthropic-sdk"),
        ("OpenAI/Python 1.99.0", "openai-sdk"),
        ("Boto3/1.40.0 md/Botocore#1.40.0 ua/2.1 os/linux", "boto3"),
        ("Botocore/1.40.0 ua/2.1", "boto3"),
        ("curl/8.5.0", "other"),
        ("", "other"),
        (None, "other"),
        ("x" * 10_000 + "claude-cli/", "other"),  # read no further than the bound
    ],
)
def test_the_client_is_a_name_from_a_closed_set(user_agent: str | None, client: str) -> None:
    assert client_of(user_agent) == client


SETS = {"design": ["design", "architect*", "system design"], "cjk": ["設計", "설계"], "ops": ["zero-downtime", ".gitignore"], "test": ["test"]}


@pytest.mark.parametrize(
    ("text", "matched"),
    [
        ("Please DESIGN a queue", ["design"]),
        ("the Architecture of it", ["design"]),  # a trailing * continues into the word
        ("a designated driver", []),  # no boundary after the word: not matched
        ("latest results", []),  # nor before it
        ("System\tDesign, please", ["design"]),  # a phrase across any run of spaces
        ("システム設計をお願いします", ["cjk"]),  # CJK keywords match inside words
        ("데이터베이스 설계를 해 주세요", ["cjk"]),
        ("a zero downtime plan", ["ops"]),  # punctuation and spaces read alike
        ("add .env to .gitignore", ["ops"]),
        ("«test»", ["test"]),  # Latin-1 signs are boundaries
        ("「test」を実行", ["test"]),  # CJK punctuation too
        ("ÜBERTEST", []),
        ("design the 設計 test", ["cjk", "design", "test"]),
    ],
)
def test_keyword_sets_match_case_insensitively_on_word_boundaries(text: str, matched: list[str]) -> None:
    assert KeywordMatcher(SETS).matched([text]) == matched


def test_keyword_matching_reads_a_bounded_prefix_of_the_texts() -> None:
    matcher = KeywordMatcher(SETS)
    assert matcher.matched(["x " * (MAX_CHARS // 2) + "design"]) == []
    assert matcher.matched(["x " * (MAX_CHARS // 4), "design"]) == ["design"]  # every text counts, up to the bound
    assert matcher.matched(["x " * (MAX_CHARS // 2), "design"]) == []


def test_a_keyword_without_letters_is_refused() -> None:
    with pytest.raises(KeywordError, match="no letter or digit"):
        KeywordMatcher({"bad": ["--"]})


def test_code_is_a_fenced_block_or_lines_that_read_as_code() -> None:
    assert has_code(["fix this:\n```\nprint(1)\n```"])
    assert has_code(["def total(xs):\n    return sum(xs)"])
    assert has_code(["const a = 1;\nlet b = f(a);"])
    assert not has_code(["Please rename the variable x to total in the report."])
    assert not has_code(["One line: x = 1"])  # one code-like line is not enough


def test_estimated_tokens_are_rounded_down_to_a_power_of_two() -> None:
    assert [bucket(n) for n in (0, 1, 3, 1000, 1024, 1500)] == [0, 1, 2, 512, 1024, 1024]


def active_bundle(tmp_path: Path) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(write_intent_bundle(tmp_path / "bundle")), []), PROVIDERS, dt.date(2026, 11, 30))


def exchange_for(bundle: ActiveBundle, name: str, body: dict, model: str = "sonnet", tools: list[str] | None = None, team: str = "eng") -> Exchange:
    raw = json.dumps(body).encode()
    request = ParsedRequest(name, raw, body, model, False, 64, [], tools=tools or [], client="claude-code")
    exchange = Exchange("req_test", protocol(name), 0.0, dt.datetime(2026, 11, 30, tzinfo=dt.UTC), principal=Principal("k", team, None), request=request)
    exchange.bundle = bundle
    return exchange


def test_every_protocol_gives_the_same_features_for_the_same_conversation(tmp_path: Path) -> None:
    bundle, source = active_bundle(tmp_path), FeatureSource(BundleRouters())
    seen = []
    for name in PROTOCOLS:
        first, second = first_and_second_turns(name)
        one = asyncio.run(source.gather(exchange_for(bundle, name, first, tools=["edit"])))
        two = asyncio.run(source.gather(exchange_for(bundle, name, second, tools=["edit"])))
        assert one["keywords"] == ["mechanical"] and one["text_chars"] == len("Rename the variable x to total."), name
        assert (one["turns"], one["first_turn"], two["turns"], two["first_turn"]) == (1, True, 2, False), name
        assert (one["tools"], one["client"], one["code"], one["reasoning"]) == (1, "claude-code", False, False), name
        assert one["input_tokens"] > 0 and one["input_tokens"] & (one["input_tokens"] - 1) == 0, name  # a power of two
        seen.append({key: value for key, value in one.items() if key != "input_tokens"})  # bodies differ in size
    assert all(features == seen[0] for features in seen)


def test_reasoning_requested_reaches_the_features(tmp_path: Path) -> None:
    bundle, source = active_bundle(tmp_path), FeatureSource(BundleRouters())
    body = {"messages": [{"role": "user", "content": "Prove it."}], "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert asyncio.run(source.gather(exchange_for(bundle, "anthropic_messages", body)))["reasoning"] is True
    chat = {"messages": [{"role": "user", "content": "Prove it."}], "reasoning_effort": "high"}
    responses = {"input": "Prove it.", "reasoning": {"effort": "high"}}
    assert asyncio.run(source.gather(exchange_for(bundle, "openai_chat", chat)))["reasoning"] is True
    assert asyncio.run(source.gather(exchange_for(bundle, "openai_responses", responses)))["reasoning"] is True


def test_no_features_for_a_request_no_router_covers(tmp_path: Path) -> None:
    bundle, source = active_bundle(tmp_path), FeatureSource(BundleRouters())
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert asyncio.run(source.gather(exchange_for(bundle, "anthropic_messages", body, model="claude-haiku-4-5"))) is None
    assert asyncio.run(source.gather(exchange_for(bundle, "anthropic_messages", body, model="sonnet"))) is not None  # the alias names a routed model
