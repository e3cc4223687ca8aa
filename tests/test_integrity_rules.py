"""The shipped injection rules as data: patterns that read the same in RE2 and in the
Rego reference, and their precision and recall over the de-obfuscated text on the
tuning corpus and on the held-out one (written before the rules were widened, never
tuned on)."""

from __future__ import annotations

import re

import pytest
import yaml

from bench.injection_accuracy import HELD_OUT, TUNING, load_bundle, measure, precision_recall, read_corpus
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def bundle():  # type: ignore[no-untyped-def]
    return load_bundle(ROOT / "policies")


def _alternatives(pattern: str, start: int, step: int) -> list[str]:
    """The top-level alternatives of the group that opens (step 1) or closes (step -1) at ``start``."""
    depth, at, parts, current = 0, start, [], ""
    while 0 <= at < len(pattern):
        char = pattern[at]
        depth += {"(": step, ")": -step}.get(char, 0)
        if depth == 0:
            break
        if char == "|" and depth == 1:
            parts.append(current)
            current = ""
        elif not (depth == 1 and char in "()"):
            current += char
        at += step
    return [*parts, current] if step == 1 else [part[::-1] for part in [*parts, current]]


def test_no_rule_puts_a_word_boundary_next_to_a_non_ascii_letter() -> None:
    """RE2 (the fast path) reads \\b as ASCII, the Rego reference as Unicode: next to a
    non-ASCII letter they disagree, so a rule must not rely on it there."""
    rules = yaml.safe_load((ROOT / "policies" / "portcullis" / "integrity" / "data.yaml").read_text())["injection_rules"]
    offending = []
    for rule in rules:
        pattern = rule["pattern"]
        for boundary in (m.start() for m in re.finditer(r"\\b", pattern)):
            after, before = boundary + 2, boundary - 1
            if after < len(pattern) and pattern[after] == "(":
                edges = [alt.removeprefix("?:")[:1] for alt in _alternatives(pattern, after, 1)]
            else:
                edges = [pattern[after : after + 1]]
            if before >= 0 and pattern[before] == ")":
                edges += [alt.rstrip("?*+")[-1:] for alt in _alternatives(pattern, before, -1)]
            elif before >= 0:
                edges.append(pattern[before])
            if any(edge and not edge.isascii() and edge.isalpha() for edge in edges):
                offending.append(rule["id"])
    assert not offending, offending


def test_the_rules_over_the_de_obfuscated_text_hold_their_floor_on_the_tuning_corpus(bundle) -> None:  # type: ignore[no-untyped-def]
    precision, recall = precision_recall(measure(bundle, read_corpus(TUNING), threshold=3)["all"])
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)


def test_the_held_out_corpus_keeps_its_measured_precision_and_recall(bundle) -> None:  # type: ignore[no-untyped-def]
    """Written before any rule changed and never tuned on; measured 0.972 precision and
    0.920 recall (rules alone 0.964 / 0.720, before the change 0.708 / 0.113). This
    guards against regressions; it is not where the rules are improved."""
    rows = read_corpus(HELD_OUT)
    assert len(rows) >= 200 and sum(not row["injection"] for row in rows) >= 80 and len({row["lang"] for row in rows}) >= 7
    counts = measure(bundle, rows, threshold=3)
    precision, recall = precision_recall(counts["all"])
    assert precision >= 0.95 and recall >= 0.85, (precision, recall)
    obfuscated = [row for row in rows if row["obfuscation"] != "none" and row["injection"]]
    assert sum(row["_result"].score >= 3 for row in obfuscated) / len(obfuscated) >= 0.8
