"""Gateways on different bundles, measured one after the other against the same fake
provider in one run: wrk at concurrency 1 and 16, then the time to the first content
delta of sequential streams. Shared by the per-capability benchmarks."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import Gateway, ensure_wrk, free_port, start_fake, wrk

ROOT = Path(__file__).resolve().parent.parent


def first_token_ms(url: str, key: str, body: dict[str, Any], count: int, headers: dict[str, str] | None = None) -> list[float]:
    """Time from sending a streamed request to its first content delta, sequentially."""
    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(count):
            started = time.perf_counter()
            request_headers = {"authorization": f"Bearer {key}", **(headers or {})}
            with client.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=request_headers) as response:
                lines = response.iter_lines()
                for line in lines:
                    compact = line.replace(": ", ":")
                    if line.startswith("data: {") and '"content":"' in compact and '"content":""' not in compact:
                        times.append((time.perf_counter() - started) * 1000)
                        break
                for _ in lines:
                    pass
    return sorted(times)


def compare(
    workdir: Path, bundles: dict[str, Path], body: dict[str, Any], duration: int, streams: int, headers: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """One gateway per bundle (label -> bundle) against an echoing fake provider."""
    wrk_bin = ensure_wrk()
    rows: list[dict[str, Any]] = []
    ttft: dict[str, dict[str, float]] = {}
    fake_port = free_port()
    fake = start_fake(workdir, fake_port, "--echo")
    gateways: list[Gateway] = []
    try:
        for label, bundle in bundles.items():
            gateway = Gateway(workdir, label.replace(" ", "-"), fake_port, bundle, {"kind": "embedded"}, {})
            gateways.append(gateway)
            request_headers = {"authorization": f"Bearer {gateway.key}", **(headers or {})}
            for connections in (1, 16):
                url = f"{gateway.url}/v1/chat/completions"
                rows.append({"label": label, "concurrency": connections, **wrk(wrk_bin, url, body, request_headers, connections, duration, workdir)})
            times = first_token_ms(gateway.url, gateway.key, body, streams, headers)
            ttft[label] = {"median_ms": statistics.median(times), "p99_ms": times[int(len(times) * 0.99) - 1]}
    finally:
        for process in [g.process for g in gateways] + [fake]:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=15)
    return rows, ttft


def report(rows: list[dict[str, Any]], ttft: dict[str, dict[str, float]], heading: str, streams: int, baseline: str, candidate: str) -> None:
    """What ``compare`` measured, with the first-token time ``candidate`` adds to ``baseline``."""
    width = max(len(label) for label in ttft)
    print(f"\n{heading}")
    for row in rows:
        figures = f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  {row['rps']:7.0f} req/s  errors {row['errors']}"
        print(f"  {row['label']:<{width}} conc {row['concurrency']:>3}: {figures}")
    print(f"\ntime to first content delta, {streams} sequential streams:")
    for label, figures in ttft.items():
        print(f"  {label:<{width}} median {figures['median_ms']:6.2f} ms   p99 {figures['p99_ms']:6.2f} ms")
    print(f"  added: {ttft[candidate]['median_ms'] - ttft[baseline]['median_ms']:+.2f} ms at the median")
