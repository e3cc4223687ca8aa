"""Precision and recall of the injection scanner (the bundle's rules) on the labelled
corpus ``tests/injection_corpus.jsonl``: direct injections in user text, indirect
ones in tool results, poisoned tool descriptions, and benign look-alikes (security
talk, install docs, logs that name the same commands and paths).

A text counts as flagged when its score reaches the threshold (default 3, the
shipped policies' value). Printed overall, per kind and per language, with every
miss and false alarm listed by rule so the rules can be improved where they fail.

    python -m bench.injection_accuracy [--threshold 3] [--bundle policies]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections import Counter
from pathlib import Path

from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import parse_bundle, read_bundle_files

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "injection_corpus.jsonl"


def load_bundle(path: Path) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(path), []), ["anthropic", "openai", "mock"], dt.date.today())


def measure(bundle: ActiveBundle, rows: list[dict], threshold: int) -> dict[str, Counter[str]]:
    results = bundle.scan_injections([row["text"] for row in rows])
    tally: dict[str, Counter[str]] = {}
    for row, result in zip(rows, results, strict=True):
        flagged = result.score >= threshold
        outcome = ("tp" if flagged else "fn") if row["injection"] else ("fp" if flagged else "tn")
        for key in ("all", f"kind:{row['kind']}", f"lang:{row['lang']}"):
            tally.setdefault(key, Counter())[outcome] += 1
        row["_result"] = result
    return tally


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "  -  "


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--bundle", type=Path, default=ROOT / "policies")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    bundle = load_bundle(args.bundle)
    started = time.perf_counter()
    tally = measure(bundle, rows, args.threshold)
    elapsed = time.perf_counter() - started
    print(f"injection scanner on {args.corpus.name}: {len(rows)} texts, threshold {args.threshold}, {elapsed * 1000:.1f} ms for all")
    print(f"{'slice':<24}{'n':>5}{'tp':>5}{'fp':>5}{'fn':>5}{'precision':>11}{'recall':>8}")
    for key in sorted(tally, key=lambda k: (k != "all", k)):
        c = tally[key]
        n = sum(c.values())
        print(f"{key:<24}{n:>5}{c['tp']:>5}{c['fp']:>5}{c['fn']:>5}{ratio(c['tp'], c['tp'] + c['fp']):>11}{ratio(c['tp'], c['tp'] + c['fn']):>8}")
    for row in rows:
        result = row["_result"]
        flagged = result.score >= args.threshold
        if flagged != row["injection"]:
            label = "missed     " if row["injection"] else "false alarm"
            print(f"  {label} [{row['kind']}/{row['lang']}] score {result.score} {','.join(result.rules) or '-'}: {row['text'][:90]!r}")


if __name__ == "__main__":
    main()
