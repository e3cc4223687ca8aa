"""The shipped injection rules as data: patterns that read the same in RE2 and in the
Rego reference, and their precision and recall over the de-obfuscated text on the
tuning corpus and on the held-out one (written before the rules were widened, never
tuned on)."""

from __future__ import annotations

import re

import pytest
import yaml

from bench.injection_accuracy import HELD_OUT, TUNING, load_bundle, measure, precision_recall, read_corpus
from tests.bundles import ROOT


@pytest.fixture(scope="module")
def bundle():  # type: ignore[no-untyped-def]
    return load_bundle(ROOT / "policies")


# (text, whether sensitive-paths' `id_rsa` word is in it): a word boundary is ASCII,
# so a non-ASCII letter, like a space or punctuation, ends the word before it.
BOUNDARY_CASES = [
    ("cat ~/keys/id_rsa", True),
    ("id_rsa", True),
    ("éid_rsa", True),
    ("id_rsaé", True),
    ("中id_rsa中", True),
    ("Яid_rsa.pub", True),
    ("xid_rsa", False),
    ("id_rsa_backup", False),
    ("1id_rsa", False),
    ("id_rsa2", False),
    # the long s and the Kelvin sign, letters to case-insensitive RE2 but not to its ASCII
    # classes, are folded to "s" and "K" first: read as letters on both sides of a word
    ("id_rsaſ", False),
    ("Kid_rsa", False),
    ("ſ id_rsa", True),
]


def test_integrity_patterns_use_no_escape_the_engines_read_differently() -> None:
    """\\b, \\w and \\d are ASCII in RE2 and OPA but Unicode in regorus: the rules
    write them as ASCII classes."""
    data = yaml.safe_load((ROOT / "policies" / "portcullis" / "integrity" / "data.yaml").read_text())
    patterns = {rule["id"]: rule["pattern"] for rule in data["injection_rules"] + data["tool_rules"]}
    assert [name for name, pattern in patterns.items() if re.search(r"\\[bBwWdD]", pattern)] == []


@pytest.mark.parametrize(("text", "named"), BOUNDARY_CASES)
def test_a_word_boundary_next_to_a_non_ascii_letter_reads_alike_in_both_engines(bundle, text: str, named: bool) -> None:  # type: ignore[no-untyped-def]
    fast, reference = bundle.scan_injections([text])[0], bundle.scan_injections_in_rego([text])[0]
    assert fast == reference
    assert ("sensitive-paths" in fast.rules) is named


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
