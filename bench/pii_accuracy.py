"""Precision and recall of the PII detectors on the labelled corpora.

``tests/pii_corpus.jsonl`` is the corpus the recognisers were tuned on;
``tests/pii_corpus_holdout.jsonl`` was written separately and never used for tuning,
so its figures are the honest ones. ``tests/pii_corpus_folding.jsonl`` was written
before the shared folding and the labels existed: Unicode spaces, full-width forms,
percent-encoded e-mails, dotted and dashed groups, labelled unformatted numbers,
JSON numbers in tool arguments, and look-alikes next to labels (``--all`` reads all
three held-out views: holdout, folding).

Texts on the ``tool_arguments`` surface are read as the gateway reads a tool call's
arguments: parsed, every string and number a text of its own, its member's name as a
label.

A detection counts when its entity type and exact text match a label of the same
line; each label is matched at most once. Printed per entity type, per language and
per surface, for the pattern layer alone and, when Presidio is installed, with NER.

    python -m bench.pii_accuracy [--ner] [--corpus PATH | --all]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from portcullis.adapters.protocols.text import visit_json_text
from portcullis.engine.pii import recognizers
from portcullis.engine.pii.context import MemberValue

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "pii_corpus.jsonl"
HOLDOUT = CORPUS.with_name("pii_corpus_holdout.jsonl")
FOLDING = CORPUS.with_name("pii_corpus_folding.jsonl")

Detect = Callable[[list[dict]], list[list[tuple[str, str]]]]  # corpus lines -> (entity, value) per line


@dataclass
class Tally:
    true: Counter[str] = field(default_factory=Counter)
    false: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)

    def add(self, key: str, labelled: Iterable[tuple[str, str]], found: Iterable[tuple[str, str]]) -> None:
        expected = Counter(labelled)
        got = Counter(found)
        for item, count in got.items():
            hit = min(count, expected[item])
            self.true[key] += hit
            self.false[key] += count - hit
        for item, count in expected.items():
            self.missed[key] += max(0, count - got[item])

    def precision(self, key: str) -> float:
        found = self.true[key] + self.false[key]
        return self.true[key] / found if found else 1.0

    def recall(self, key: str) -> float:
        labelled = self.true[key] + self.missed[key]
        return self.true[key] / labelled if labelled else 1.0


def load(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score(lines: list[dict], detect: Detect, entities: Iterable[str]) -> dict[str, Tally]:
    """Tallies by entity type, language and surface, for labels of ``entities``."""
    kept = set(entities)
    found = detect(lines)
    tallies = {"entity": Tally(), "lang": Tally(), "surface": Tally()}
    for line, detected in zip(lines, found, strict=True):
        labels = [(e["type"], e["value"]) for e in line["entities"] if e["type"] in kept]
        hits = [d for d in detected if d[0] in kept]
        for entity in kept:
            tallies["entity"].add(entity, [x for x in labels if x[0] == entity], [x for x in hits if x[0] == entity])
        tallies["lang"].add(line["lang"], labels, hits)
        tallies["surface"].add(line["surface"], labels, hits)
    return tallies


def gateway_texts(line: dict) -> list[str]:
    """The texts the gateway's filter reads for a corpus line."""
    if line["surface"] != "tool_arguments":
        return [line["text"]]
    texts: list[str] = []
    visit_json_text(line["text"], "tool_arguments", lambda _, text: texts.append(text) or text)
    return texts


def patterns(lines: list[dict]) -> list[list[tuple[str, str]]]:
    found = []
    for line in lines:
        texts = gateway_texts(line)
        found.append([(f.entity, t[f.start : f.end]) for t in texts for f in recognizers.find(t, member=t.member if isinstance(t, MemberValue) else None)])
    return found


def with_ner(lines: list[dict]) -> list[list[tuple[str, str]]]:
    from portcullis.adapters.pii.presidio import NerDetector

    async def run() -> list[list[tuple[str, str]]]:
        ner = NerDetector()
        await ner.load()
        found = []
        for text in (line["text"] for line in lines):  # one text per call, as the gateway sends one request's strings
            [more] = await ner.detect([text], recognizers.NER_ENTITIES, None)  # type: ignore[arg-type]
            merged = recognizers.resolve_overlaps([*recognizers.find(text), *more])
            found.append([(f.entity, text[f.start : f.end]) for f in merged])
        ner.close()
        return found

    return asyncio.run(run())


def report(title: str, tallies: dict[str, Tally]) -> None:
    print(f"\n{title}")
    for view, tally in tallies.items():
        keys = sorted(set(tally.true) | set(tally.false) | set(tally.missed))
        print(f"  {'by ' + view:<16} {'precision':>9} {'recall':>7} {'found':>6} {'labelled':>8}")
        for key in keys:
            found, labelled = tally.true[key] + tally.false[key], tally.true[key] + tally.missed[key]
            print(f"  {key:<16} {tally.precision(key):>9.3f} {tally.recall(key):>7.3f} {found:>6} {labelled:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ner", action="store_true", help="also measure patterns + Presidio NER")
    parser.add_argument("--corpus", type=Path, default=HOLDOUT)
    parser.add_argument("--all", action="store_true", help="every held-out corpus, one after the other")
    args = parser.parse_args()
    for corpus in (HOLDOUT, FOLDING) if args.all else (args.corpus,):
        lines = load(corpus)
        print(f"corpus: {corpus.name}, {len(lines)} lines, {sum(len(line['entities']) for line in lines)} labels")
        report("patterns (regex + checksum), structured identifiers", score(lines, patterns, recognizers.ENTITY_ORDER))
        if args.ner:
            report("patterns + NER (Presidio, en_core_web_sm), every type", score(lines, with_ner, recognizers.ALL_ENTITIES))


if __name__ == "__main__":
    main()
