"""Policy decision latency alone (section 4 of bench/run.py), for the working tree's
Rego and, optionally, other versions of it, in one run so the figures compare.

    .venv/bin/python bench/decisions.py
    .venv/bin/python bench/decisions.py --compare before=/tmp/old/policies/portcullis

Every version gets the generated 50-team / 500-user / 40-model bundle with 201
governance rules (bench/bundle_gen.py) and the same mixed requests. Versions take
turns, round after round, so a busy neighbour on a shared machine slows each about
equally; each figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402
from bench.run import decision_latency  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=5000, help="requests per round and version")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR", help="another directory of the bundle's *.rego")
    args = parser.parse_args()
    versions = {"working tree": ROOT / "policies" / "portcullis"}
    for item in args.compare:
        label, _, directory = item.partition("=")
        versions[label] = Path(directory)

    figures: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="portcullis-decisions-") as tmp:
        bundles = {label: bundle_gen.write(Path(tmp) / f"bundle-{n}", modules=modules) for n, (label, modules) in enumerate(versions.items())}
        for _ in range(args.rounds):
            for label, bundle in bundles.items():
                for mode, result in decision_latency(bundle, args.decisions).items():
                    for stat, value in result.items():
                        figures.setdefault((label, mode, stat), []).append(value)

    print(f"policy decision, {args.decisions} mixed requests x {args.rounds} rounds (regorus, one thread), median of the rounds:")
    for label in versions:
        for mode in ("indexed (served)", "no index (baseline)"):
            median, p99 = (statistics.median(figures[(label, mode, stat)]) for stat in ("median_us", "p99_us"))
            print(f"  {label:<14} {mode:<20} median {median:7.1f} µs   p99 {p99:7.1f} µs")


if __name__ == "__main__":
    main()
