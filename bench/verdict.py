"""What the headline benchmark's rows mean: which rows are INVALID (a refusal or a
socket error means the load measured something other than serving), and issue 14's
targets computed as ratios of rows measured in the same run, each PASS or FAIL.

Pure functions over the rows ``bench.pipeline`` records, so the rules are unit-tested
(tests/test_unit_bench_verdict.py) apart from any load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Row ``target`` values.
DIRECT, FLOOR, BARE, QUICKSTART, QUICKSTART_SHARED, LITELLM = "direct", "floor", "bare", "quickstart", "quickstart-shared", "litellm"
GATEWAYS = (BARE, QUICKSTART, QUICKSTART_SHARED)
CHAT, CHAT_STREAM = "chat", "chat stream"
RSS_LIMIT_MB = 120.0


@dataclass(frozen=True)
class Goal:
    """One target: ``value`` against ``limit`` (at most, or at least when ``at_least``)."""

    name: str
    value: float | None  # None: a row it needs was not measured (or is INVALID)
    limit: float
    unit: str
    at_least: bool = False
    stretch: float | None = None

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def line(self) -> str:
        sign = "≥" if self.at_least else "≤"
        stretch = f", stretch {self.stretch:g}" if self.stretch is not None else ""
        verdict = {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[self.passed]
        value = "—" if self.value is None else f"{self.value:.2f} {self.unit}"
        return f"{verdict:<12} {self.name}: {value} (target {sign} {self.limit:g} {self.unit}{stretch})"


def invalid_reasons(row: dict[str, Any]) -> list[str]:
    """Why a row does not measure serving: any non-2xx answer, any socket error (wrk's
    or the first-byte client's), a warm-up that was refused, or no request completed."""
    reasons = []
    if row.get("refused"):
        reasons.append(f"warm-up answered {row['refused']}")
    if row.get("non_2xx"):
        reasons.append(f"{row['non_2xx']} non-2xx")
    if row.get("socket_errors"):
        timeouts = f" ({row['timeouts']} of them timeouts)" if row.get("timeouts") else ""
        reasons.append(f"{row['socket_errors']} socket errors{timeouts}")
    if not row.get("refused") and not row.get("requests"):
        reasons.append("no request completed")
    first = row.get("first_byte") or {}
    if first.get("non_2xx"):
        reasons.append(f"{first['non_2xx']} non-2xx streams")
    if first.get("socket_errors"):
        reasons.append(f"{first['socket_errors']} streams cut or without content")
    return reasons


def find(rows: list[dict[str, Any]], target: str, scenario: str, concurrency: int, workers: str | None = None) -> dict[str, Any] | None:
    """The valid row measuring ``target`` (at ``workers``, when given) on ``scenario`` at ``concurrency``."""
    for row in rows:
        same = row["target"] == target and row["scenario"] == scenario and row["concurrency"] == concurrency
        if same and (workers is None or row.get("workers") == workers) and not invalid_reasons(row):
            return row
    return None


def _added(candidate: dict[str, Any] | None, base: dict[str, Any] | None, field: str) -> float | None:
    if candidate is None or base is None:
        return None
    return candidate[field] - base[field]


def _ttfb(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return row["first_byte"] if row is not None and row.get("first_byte") else None


def goals(rows: list[dict[str, Any]], gateways: list[dict[str, Any]]) -> list[Goal]:
    """Issue 14's targets, for each workers setting the gateway rows were measured at;
    ``gateways``: each gateway run's ``memory`` (its processes' RSS and peak)."""
    direct1 = find(rows, DIRECT, CHAT, 1)
    floor16 = find(rows, FLOOR, CHAT, 16)
    direct_stream = _ttfb(find(rows, DIRECT, CHAT_STREAM, 1))
    found: list[Goal] = []
    settings = sorted({row["workers"] for row in rows if row["target"] in GATEWAYS}, key=lambda w: (w != "1", w))
    for workers in settings:
        label = f"workers {workers}"
        embedded1 = find(rows, QUICKSTART, CHAT, 1, workers)
        shared1 = find(rows, QUICKSTART_SHARED, CHAT, 1, workers)
        embedded16 = find(rows, QUICKSTART, CHAT, 16, workers)
        ratio = embedded16["rps"] / floor16["rps"] if embedded16 is not None and floor16 is not None and floor16["rps"] else None
        stream = _ttfb(find(rows, QUICKSTART, CHAT_STREAM, 1, workers))
        found += [
            Goal(f"added p50 at c=1, quickstart pipeline, embedded, {label}", _added(embedded1, direct1, "p50_ms"), 0.8, "ms", stretch=0.5),
            Goal(f"added p50 at c=1, quickstart pipeline, shared store, {label}", _added(shared1, direct1, "p50_ms"), 1.5, "ms"),
            Goal(f"c=16 req/s ÷ floor, quickstart pipeline, embedded, {label}", ratio, 0.40, "×", at_least=True, stretch=0.5),
            Goal(f"stream time to first content byte added at c=1, quickstart, embedded, {label}", _added(stream, direct_stream, "ttfb_p50_ms"), 1.0, "ms"),
        ]
    peaks = [process["peak_mb"] for gateway in gateways if gateway.get("target") in GATEWAYS for process in gateway["memory"]]
    found.append(Goal("peak RSS of any gateway process", max(peaks) if peaks else None, RSS_LIMIT_MB, "MB"))
    return found
