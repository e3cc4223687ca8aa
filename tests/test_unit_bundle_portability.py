"""Activation refuses what OPA and regorus would read differently, naming the field;
and the limits index keeps user names apart from its own placeholders."""

from __future__ import annotations

import copy
import datetime as dt
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import Bundle, BundleError, read_bundle_files, split_sources
from portcullis.engine.portable import MAX_SAFE_INTEGER, portability_problems

ROOT = Path(__file__).resolve().parent.parent
MODULES, _, SHIPPED = split_sources(read_bundle_files(ROOT / "policies"))
TEAM = sorted(SHIPPED["portcullis"]["tenants"]["teams"])[0]


def activated(change: Callable[[dict[str, Any]], None] = lambda data: None) -> ActiveBundle:
    data = copy.deepcopy(SHIPPED)
    change(data["portcullis"])
    bundle = Bundle(revision="t", roots=("",), digest="-", modules=MODULES, tests={}, data=data, signed_by=None)
    return activate(bundle, providers={"mock"}, today=dt.date(2026, 12, 1))


def _team_glob(pattern: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["tenants"]["teams"][TEAM]["models"].append(pattern)


def _tool_glob(pattern: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["integrity"]["policies"]["glob"] = {"teams": [TEAM], "tools": {"allow": ["read_*", pattern]}}

    return change


def _rule_pattern(pattern: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["integrity"]["tool_rules"].append({"id": "probe", "tools": ["*"], "argument": "*", "pattern": pattern, "message": "probe"})


def _rate(rpm: int) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["governance"]["rules"].update({"probe": {"subject": {"team": TEAM}, "rate": {"rpm": rpm}}})


def _budget(limit: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["governance"]["rules"].update({"probe": {"subject": {"team": TEAM}, "budget": {"limit_usd": limit, "period": "CalendarDay"}}})


REFUSED = [
    (_team_glob("{gpt"), f"data.portcullis.tenants.teams.{TEAM}.models[2]: glob '{{gpt' uses '{{'"),
    (_team_glob("gpt-4o-?ini"), "uses '?'"),
    (_team_glob("[a-z]*"), "uses '[' ']'"),
    (_tool_glob("tool-?"), "data.portcullis.integrity.policies.glob.tools.allow[1]: glob 'tool-?' uses '?'"),
    (_tool_glob("tool\\*"), "uses '\\\\'"),
    (_rule_pattern(r"(?i)\bid_rsa\b"), "data.portcullis.integrity.tool_rules[3].pattern: integrity rule 'probe': its pattern uses \\b"),
    (_rule_pattern(r"^\w+$"), "uses \\w"),
    (_rule_pattern(r"\d{3}"), "uses \\d"),
    (_rule_pattern(r"(?x) a b"), "integrity rule 'probe': its pattern is not RE2 syntax"),
    (_rule_pattern(r"[a-z&&[^x]]"), "has && inside a character class"),
    (_rule_pattern(r"[a[b]]"), "nests a character class"),
    (_rule_pattern(r"[a-z--x]"), "has -- inside a character class"),
    (_rule_pattern(r"(?i)[^a~~b]"), "has ~~ inside a character class"),
    (_rate(MAX_SAFE_INTEGER + 1), f"data.portcullis.governance.rules.probe.rate.rpm: {MAX_SAFE_INTEGER + 1} is beyond ±(2^53 − 1)"),
    (_rate(2**64 + 1), "is beyond ±(2^53 − 1)"),
    (_budget("1234567890.5"), "data.portcullis.governance.rules.probe.budget.limit_usd: '1234567890.5' must be a decimal with at most 9 digits"),
    (_budget("1.0000001"), "at most 9 digits before the point and 6 after"),
]


@pytest.mark.parametrize(("change", "message"), REFUSED, ids=[message[-40:] for _, message in REFUSED])
def test_activation_refuses_what_the_engines_read_differently(change: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(BundleError) as refused:
        activated(change)
    assert message in str(refused.value)


PORTABLE = [
    _team_glob("gpt-*"),
    _tool_glob("outil-é*"),
    _rate(MAX_SAFE_INTEGER),
    _budget("999999999.999999"),
    _rule_pattern("(?i)[^/]+"),
    _rule_pattern(r"[]a-][[:alpha:]_-]+"),
    _rule_pattern(r"x--y[\]&]&&"),
]


@pytest.mark.parametrize("change", PORTABLE)
def test_activation_accepts_the_portable_forms(change: Callable[[dict[str, Any]], None]) -> None:
    activated(change)


def test_a_float_or_an_integer_anywhere_in_the_data_is_checked() -> None:
    problems = portability_problems({"catalog": {"models": {"m": {"targets": [{"priority": -(2**60), "context_window": 1e300}]}}}})
    assert problems == [
        f"data.portcullis.catalog.models.m.targets[0].priority: {-(2**60)} is beyond ±(2^53 − 1) = {MAX_SAFE_INTEGER},"
        " the largest integer every Rego engine keeps exactly",
        "data.portcullis.catalog.models.m.targets[0].context_window: 1e+300 is beyond ±(2^53 − 1), the range every Rego engine evaluates alike",
    ]
    assert portability_problems({"a": [True, 0.6, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]}) == []


def test_a_key_yaml_read_as_a_number_or_a_boolean_is_refused() -> None:
    problems = portability_problems({"tenants": {"teams": {123: {"models": ["*"]}, True: {"models": ["*"]}}}})
    assert problems == [
        "data.portcullis.tenants.teams: key 123 is not a string; quote it, since OPA reads it as '123' text",
        "data.portcullis.tenants.teams: key True is not a string; quote it, since OPA reads it as 'true' text",
    ]


def _per_user_rule(data: dict[str, Any]) -> None:
    data["governance"]["rules"]["probe-per-user"] = {"subject": {"team": TEAM, "per": "user"}, "rate": {"rpm": 7}}
    data["governance"]["rules"]["probe-named"] = {"subject": {"team": TEAM, "user": "carol"}, "rate": {"rpm": 3}}


@pytest.mark.parametrize("user", ["-", "*", "keyless", "team", "users"])
def test_a_user_named_like_an_index_placeholder_keeps_a_counter_of_its_own(user: str) -> None:
    bundle = activated(_per_user_rule)
    request = {"protocol": "anthropic_messages", "model": "mini", "stream": False, "requires": []}
    named = bundle.decide({"principal": {"team": TEAM, "user": user, "key_id": "key_00000000000000aa"}, "request": request})
    keyless = bundle.decide({"principal": {"team": TEAM, "user": None, "key_id": "key_00000000000000aa"}, "request": request})
    scopes = {counter.scope for counter in named.limits.counters}
    assert f"user:{TEAM}/{user}" in scopes
    assert "key:key_00000000000000aa" not in scopes
    assert "key:key_00000000000000aa" in {counter.scope for counter in keyless.limits.counters}
    carol = bundle.decide({"principal": {"team": TEAM, "user": "carol", "key_id": "key_00000000000000aa"}, "request": request})
    assert min(counter.block for counter in carol.limits.counters if counter.scope == f"user:{TEAM}/carol" and counter.metric == "requests") == 3


@pytest.mark.parametrize("demo_key", ["demo/-", "demo/{key}", "-/alice", "demo/josé"])
def test_the_demo_key_takes_only_names_keys_create_accepts(demo_key: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(tmp_path / "absent.yaml"), f"--demo-key={demo_key}"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "--demo-key" in done.stderr and "must be 1-128 letters" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("module", "change", "rule"),
    [
        ("package portcullis.pii\n\npolicies := {}\n", lambda data: None, "data.portcullis.pii.policies"),  # beside a section's data
        ("package portcullis.notes\n\nteam := 1\n", lambda data: data.update({"notes": {"team": {"x": 1}}}), "data.portcullis.notes.team"),  # data below
        ("package portcullis\n\ncompiled := {}\n", lambda data: None, "data.portcullis.compiled"),  # where the gateway puts the index
    ],
)
def test_a_rule_that_shares_its_path_with_data_is_refused(module: str, change: Callable[[dict[str, Any]], None], rule: str) -> None:
    """OPA refuses such a bundle; regorus would read the data and drop the rule."""
    data = copy.deepcopy(SHIPPED)
    change(data["portcullis"])
    bundle = Bundle(revision="t", roots=("",), digest="-", modules={**MODULES, "clash.rego": module}, tests={}, data=data, signed_by=None)
    with pytest.raises(BundleError, match=f"rule {re.escape(rule)} shares its path with bundle data"):
        activate(bundle, providers={"mock"}, today=dt.date(2026, 12, 1))
