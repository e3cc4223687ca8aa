"""The labelled task sets the intent/complexity router is measured on stay well-formed and balanced.

The sets were written before any routing rule, so their worth is that they do not drift towards
whatever the rules find easy: every line keeps the declared schema, the held-out set shares no
task with the tuning set, each domain and tier keeps at least a quarter of each file, the
surface features a rule could lean on (agent envelopes, length, language) stay spread across
tiers, and the counts published in the labelling guide match the files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
TUNING = DATA / "intent_tasks_tuning.jsonl"
HELDOUT = DATA / "intent_tasks_heldout.jsonl"
GUIDE = DATA / "intent_tasks.md"

DOMAINS = ("coding", "chat", "analysis")
TIERS = ("light", "standard", "frontier")
CLIENTS = ("claude-code", "codex", "opencode", "sdk")
AGENTS = ("claude-code", "codex", "opencode")
FIELDS = {"id": str, "domain": str, "tier": str, "client": str, "system": str, "tools": int, "turns": int, "reasoning": bool, "text": str}
SETS = {"tuning": (TUNING, "t", 60), "heldout": (HELDOUT, "h", 180)}
CJK_OR_HANGUL = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]")


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module", params=sorted(SETS))
def task_set(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    path, _, _ = SETS[request.param]
    return request.param, load(path)


def test_every_line_has_the_schema(task_set: tuple[str, list[dict[str, Any]]]) -> None:
    name, tasks = task_set
    _, prefix, size = SETS[name]
    assert len(tasks) == size
    for task in tasks:
        assert set(task) == set(FIELDS), task.get("id")
        for field, kind in FIELDS.items():
            # bool is an int subclass: tools/turns must be real integers, reasoning a real bool.
            assert type(task[field]) is kind, (task["id"], field)
        assert re.fullmatch(rf"{prefix}-\d{{3}}", task["id"]), task["id"]
        assert task["domain"] in DOMAINS and task["tier"] in TIERS and task["client"] in CLIENTS, task["id"]
        assert 1 <= len(task["text"]) <= 1500, task["id"]
        assert task["text"] == task["text"].strip(), task["id"]
        assert 0 <= task["tools"] <= 64 and task["turns"] >= 1, task["id"]


def test_agent_clients_send_their_envelope(task_set: tuple[str, list[dict[str, Any]]]) -> None:
    _, tasks = task_set
    for task in tasks:
        if task["client"] in AGENTS:
            assert len(task["system"]) > 500 and task["tools"] >= 8, task["id"]


def test_ids_are_unique_across_both_files() -> None:
    ids = [task["id"] for path, _, _ in SETS.values() for task in load(path)]
    assert len(ids) == len(set(ids))


def _normalised(text: str) -> str:
    return " ".join(text.casefold().split())


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def test_no_text_is_shared_or_near_copied_between_the_files() -> None:
    tuning, heldout = load(TUNING), load(HELDOUT)
    for tasks in (tuning, heldout):
        texts = [_normalised(task["text"]) for task in tasks]
        assert len(texts) == len(set(texts))
    assert not {_normalised(t["text"]) for t in tuning} & {_normalised(h["text"]) for h in heldout}
    for t in tuning:
        for h in heldout:
            a, b = _words(t["text"]), _words(h["text"])
            overlap = len(a & b) / len(a | b)
            assert overlap < 0.45, (t["id"], h["id"], round(overlap, 2))


def test_each_domain_and_tier_is_at_least_a_quarter(task_set: tuple[str, list[dict[str, Any]]]) -> None:
    _, tasks = task_set
    domains, tiers = Counter(t["domain"] for t in tasks), Counter(t["tier"] for t in tasks)
    for domain in DOMAINS:
        assert domains[domain] * 4 >= len(tasks), domains
    for tier in TIERS:
        assert tiers[tier] * 4 >= len(tasks), tiers


def test_surface_features_are_spread_across_tiers(task_set: tuple[str, list[dict[str, Any]]]) -> None:
    _, tasks = task_set
    for tier in TIERS:
        in_tier = [t for t in tasks if t["tier"] == tier]
        assert {t["domain"] for t in in_tier} == set(DOMAINS), tier
        assert sum(t["client"] in AGENTS for t in in_tier) >= 3, tier
        assert sum(t["client"] == "sdk" for t in in_tier) >= 3, tier
        assert sum(t["reasoning"] for t in in_tier) >= 1, tier
        assert sum(bool(CJK_OR_HANGUL.search(t["text"])) for t in in_tier) >= 1, tier
        assert sum("\n" in t["text"] for t in in_tier) >= 2, tier  # pasted code, logs or tables
    frontier = [t for t in tasks if t["tier"] == "frontier"]
    light = [t for t in tasks if t["tier"] == "light"]
    assert any(len(t["text"]) < 150 for t in frontier)
    assert any(len(t["text"]) > 500 for t in light)


def _count_table(tasks: list[dict[str, Any]]) -> list[str]:
    cells = Counter((t["domain"], t["tier"]) for t in tasks)
    rows = []
    for domain in DOMAINS:
        counts = [cells[domain, tier] for tier in TIERS]
        rows.append(f"| {domain} | {' | '.join(map(str, counts))} | {sum(counts)} |")
    totals = [sum(cells[d, tier] for d in DOMAINS) for tier in TIERS]
    rows.append(f"| total | {' | '.join(map(str, totals))} | {sum(totals)} |")
    return rows


def test_the_guide_publishes_the_real_counts(task_set: tuple[str, list[dict[str, Any]]]) -> None:
    _, tasks = task_set
    guide = GUIDE.read_text(encoding="utf-8")
    path, _, _ = SETS[task_set[0]]
    section = guide.split(f"`{path.name}`", 1)[1]
    for row in _count_table(tasks):
        assert row in section, row
