"""Precision and recall of the injection scanner (the bundle's rules) on a labelled
corpus: direct injections in user text, indirect ones in tool results, poisoned tool
descriptions, obfuscated ones, and benign look-alikes (security talk, install docs,
logs that name the same commands and paths).

A text counts as flagged when its score reaches the threshold (default 3, the
shipped policies' value). Printed per layer — the rules alone, the rules over the
de-obfuscated text, and, when installed and asked for, the classifier on top — then
per kind, language and obfuscation for the last layer, with every miss and false
alarm listed by rule so the rules can be improved where they fail (on a tuning corpus,
never on a held-out one).

    python -m bench.injection_accuracy [--threshold 3] [--bundle policies] [--corpus F] [--classifier]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files
from portcullis.engine.integrity.injection import ScanResult
from portcullis.engine.integrity.scanner import Scanner

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "injection_corpus.jsonl"
HELD_OUT = ROOT / "tests" / "injection_corpus_heldout2.jsonl"
TUNING = ROOT / "tests" / "injection_corpus_tuning.jsonl"

Layer = Callable[[list[dict]], list[bool]]


def load_bundle(path: Path) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(path), []), ["anthropic", "openai", "mock"], dt.date.today())


def read_corpus(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(bundle: ActiveBundle, rows: list[dict], threshold: int, scanner: Scanner | None = None) -> dict[str, Counter[str]]:
    """Outcomes by slice for the bundle's scanner (or ``scanner``); each row keeps its result."""
    scan = scanner.scan if scanner is not None else bundle.scanner.scan
    results = [scan(row["text"]) for row in rows]
    for row, result in zip(rows, results, strict=True):
        row["_result"] = result
    return tally(rows, [result.score >= threshold for result in results])


def tally(rows: list[dict], flagged: list[bool]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for row, hit in zip(rows, flagged, strict=True):
        outcome = ("tp" if hit else "fn") if row["injection"] else ("fp" if hit else "tn")
        for key in ("all", f"kind:{row['kind']}", f"lang:{row['lang']}", f"obfuscation:{row.get('obfuscation', 'none')}"):
            counts.setdefault(key, Counter())[outcome] += 1
    return counts


def precision_recall(counts: Counter[str]) -> tuple[float, float]:
    tp, fp, fn = counts["tp"], counts["fp"], counts["fn"]
    return (tp / (tp + fp) if tp + fp else 1.0), (tp / (tp + fn) if tp + fn else 1.0)


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "  -  "


def print_table(counts: dict[str, Counter[str]], only_all: bool = False) -> None:
    print(f"{'slice':<28}{'n':>5}{'tp':>5}{'fp':>5}{'fn':>5}{'precision':>11}{'recall':>8}")
    for key in sorted(counts, key=lambda k: (k != "all", k)):
        if only_all and key != "all":
            continue
        c = counts[key]
        n = sum(c.values())
        print(f"{key:<28}{n:>5}{c['tp']:>5}{c['fp']:>5}{c['fn']:>5}{ratio(c['tp'], c['tp'] + c['fp']):>11}{ratio(c['tp'], c['tp'] + c['fn']):>8}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--bundle", type=Path, default=ROOT / "policies")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--classifier", action="store_true", help="add the optional ML classifier layer (needs the 'ml' extra)")
    parser.add_argument("--quiet", action="store_true", help="no per-text misses and false alarms")
    args = parser.parse_args()
    rows = read_corpus(args.corpus)
    bundle = load_bundle(args.bundle)
    rules = (bundle.bundle.data["portcullis"].get("integrity") or {}).get("injection_rules") or []
    print(f"injection scanner on {args.corpus.name}: {len(rows)} texts, threshold {args.threshold}")
    plain = [result.score >= args.threshold for result in map(Scanner(rules, deobfuscate=False).scan, (row["text"] for row in rows))]
    print("\nlayer 1: the rules alone")
    print_table(tally(rows, plain), only_all=True)
    started = time.perf_counter()
    counts = measure(bundle, rows, args.threshold)
    elapsed = time.perf_counter() - started
    print(f"\nlayer 2: the rules over the de-obfuscated text ({elapsed * 1000:.1f} ms for all)")
    flagged = [row["_result"].score >= args.threshold for row in rows]
    if args.classifier:
        print_table(counts, only_all=True)
        flagged = _with_classifier(rows, flagged)
        counts = tally(rows, flagged)
        print("\nlayer 3: + the classifier on untrusted surfaces (tool results, tool descriptions)")
    print_table(counts)
    if args.quiet:
        return
    for row, hit in zip(rows, flagged, strict=True):
        result: ScanResult = row["_result"]
        if hit != row["injection"]:
            label = "missed     " if row["injection"] else "false alarm"
            print(f"  {label} [{row['kind']}/{row['lang']}] score {result.score} {','.join(result.rules) or '-'}: {row['text'][:90]!r}")


def _with_classifier(rows: list[dict], flagged: list[bool]) -> list[bool]:
    from portcullis.adapters.integrity.classifier import UNTRUSTED_SURFACES, load_classifier

    classifier = load_classifier()
    started = time.perf_counter()
    verdicts = [hit or (row["surface"] in UNTRUSTED_SURFACES and classifier.is_injection(row["text"])) for row, hit in zip(rows, flagged, strict=True)]
    print(f"  classifier: {len(rows)} texts in {(time.perf_counter() - started) * 1000:.1f} ms")
    return verdicts


if __name__ == "__main__":
    main()
