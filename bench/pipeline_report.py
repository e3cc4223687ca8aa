"""The headline benchmark's printout: one table per scenario with every target side by
side at each concurrency, what each adds over upstream direct and how it compares with
the floor, the gateways' processes and memory, the INVALID rows, and issue 14's targets."""

from __future__ import annotations

from typing import Any

from bench import verdict

LABELS = {
    verdict.DIRECT: "upstream direct",
    verdict.FLOOR: "floor (aiohttp proxy)",
    verdict.BARE: "gateway, no team policies",
    verdict.QUICKSTART: "gateway, quickstart pipeline",
    verdict.QUICKSTART_SHARED: "gateway, quickstart, Redis+PG",
    verdict.LITELLM: "LiteLLM 1.108.7",
}
ORDER = list(LABELS)


def label(row: dict[str, Any]) -> str:
    name = LABELS.get(row["target"], row["target"])
    if row["workers"] == "-":
        return name
    return f"{name} (w {row['workers']}: {row['processes']} proc)"


def _same(rows: list[dict[str, Any]], target: str, scenario: str, concurrency: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["target"] == target and r["scenario"] == scenario and r["concurrency"] == concurrency and not r["invalid"]), None)


def _figures(row: dict[str, Any], direct: dict[str, Any] | None, floor: dict[str, Any] | None) -> str:
    if row.get("refused"):
        return f"{'refused at warm-up: ' + str(row['refused']):>60}"
    added = f"{row['p50_ms'] - direct['p50_ms']:+8.2f}" if direct else f"{'':>8}"
    versus = f"{row['rps'] / floor['rps']:6.2f}×" if floor and floor["rps"] else f"{'':>7}"
    text = f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['rps']:8.0f} {added} {versus}"
    first = row.get("first_byte")
    if first:
        base = direct.get("first_byte") if direct else None
        ttfb_added = f"{first['ttfb_p50_ms'] - base['ttfb_p50_ms']:+7.2f}" if base else f"{'':>7}"
        text += f" {first['ttfb_p50_ms']:7.2f} {first['ttfb_p99_ms']:7.2f} {ttfb_added}{'*' if first['client_bound'] else ' '}"
    else:
        text += f" {'':>7} {'':>7} {'':>7} "
    return text


def report(document: dict[str, Any]) -> int:
    """Print the run; 1 when any row is INVALID, else 0."""
    rows = document["rows"]
    print(f"\nHeadline — {document['cores']} cores shared by wrk, the fake provider and the target; {document['duration_s']}s per wrk run")
    print("added = p50 minus upstream direct's p50 at the same concurrency; × floor = req/s over the floor's; ttfb = first content byte (Python client)")
    heading = f"{'target':<46} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'added':>8} {'× floor':>7} {'ttfb50':>7} {'ttfb99':>7} {'+ttfb':>7}  errors"
    for scenario in dict.fromkeys(row["scenario"] for row in rows):
        for concurrency in dict.fromkeys(row["concurrency"] for row in rows if row["scenario"] == scenario):
            print(f"\n{scenario}, concurrency {concurrency}\n{heading}\n{'-' * len(heading)}")
            direct = _same(rows, verdict.DIRECT, scenario, concurrency)
            floor = _same(rows, verdict.FLOOR, scenario, concurrency)
            chosen = [r for r in rows if r["scenario"] == scenario and r["concurrency"] == concurrency]
            for row in sorted(chosen, key=lambda r: (ORDER.index(r["target"]) if r["target"] in ORDER else len(ORDER), r["workers"])):
                streams = row.get("first_byte") or {}
                errors = sum(source.get(kind, 0) for source in (row, streams) for kind in ("non_2xx", "socket_errors"))
                flag = "  INVALID" if row["invalid"] else ""
                print(f"{label(row):<46} {_figures(row, direct, floor)} {errors:>6}{flag}")
    checks = [row for row in rows if row["target"] == verdict.DIRECT and row.get("first_byte") and not row["invalid"]]
    if checks:
        # Its first byte comes before wrk's whole stream ends: a ttfb above that p50 is the client's own cost.
        figures = ", ".join(f"c={r['concurrency']} {r['first_byte']['ttfb_p50_ms']:.2f} vs {r['p50_ms']:.2f} ms" for r in checks)
        print(f"\nthe first-byte client against the direct {checks[0]['scenario']} row (its ttfb p50 vs wrk's whole-stream p50): {figures}")
    if any((row.get("first_byte") or {}).get("client_bound") for row in rows):
        print("\n* the Python client completed under 80 % of wrk's rate there: its own queueing is in that ttfb (compare with direct's)")
    print("\nprocesses and memory (after the runs; peak = VmHWM):")
    for gateway in document["gateways"]:
        name = LABELS.get(gateway["target"], gateway["target"]) + ("" if gateway["workers"] == "-" else f", workers {gateway['workers']}")
        if gateway["skipped"]:
            print(f"  {name}: {gateway['processes']} process(es), as with workers 1: rows not repeated")
            continue
        # With several processes the first is the one we started: the supervisor of the others.
        count = len(gateway["memory"])
        roles = ["supervisor", *["worker"] * (count - 1)] if count > 1 else [""] * count
        members = ", ".join(
            f"{role} {p['name']}[{p['pid']}] {p['rss_mb']:.0f} MB (peak {p['peak_mb']:.0f})".strip() for role, p in zip(roles, gateway["memory"], strict=True)
        )
        print(f"  {name}: {len(gateway['memory'])} process(es): {members}")
    invalid = [row for row in rows if row["invalid"]]
    print("\ntargets (issue 14, same-run ratios):")
    for goal in verdict.goals(rows, document["gateways"]):
        print(f"  {goal.line()}")
    if invalid:
        print(f"\nINVALID: {len(invalid)} row(s) measured refusals or errors, not serving; their figures do not count:")
        for row in invalid:
            print(f"  {label(row)}, {row['scenario']}, c={row['concurrency']}: {'; '.join(row['invalid'])}")
        return 1
    print("\nall rows valid (no non-2xx, no socket errors)")
    return 0
