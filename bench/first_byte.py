"""Time to the first content byte of streamed answers, at a given concurrency: wrk
times whole responses, and a stream's user waits for its first text, not its end.

``concurrency`` aiohttp connections (one keep-alive connection each, on uvloop) send
the same streamed request back to back for ``duration`` seconds; each answer is timed
from sending to the first chunk that carries text (an SSE event with a non-empty
``content`` or a ``text_delta``) and to its end. The client is Python, so its own
overhead is part of every figure: compare a row with the direct row of the same run,
and ``client_bound`` says when the client, not the server, set the pace."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from typing import Any

import aiohttp

# First text of an OpenAI chat chunk ("content": "x…") or an Anthropic content_block_delta.
CONTENT = re.compile(rb'"content"\s*:\s*"[^"]|"type"\s*:\s*"text_delta"')
# How far the client may fall short of wrk's rate before its figures stop describing the server.
CLIENT_BOUND_RATIO = 0.8


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


async def _one_connection(url: str, body: bytes, headers: dict[str, str], until: float, timings: dict[str, Any]) -> None:
    connector = aiohttp.TCPConnector(limit=1, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        while time.perf_counter() < until:
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    if response.status // 100 != 2:
                        timings["non_2xx"] += 1
                        await response.read()
                        continue
                    seen = b""
                    first = None
                    async for chunk in response.content.iter_any():
                        if first is None:
                            seen = seen[-64:] + chunk  # a marker may straddle two chunks
                            if CONTENT.search(seen):
                                first = time.perf_counter()
                    ended = time.perf_counter()
            except (TimeoutError, aiohttp.ClientError):
                timings["socket_errors"] += 1
                continue
            if first is None:
                timings["no_content"] += 1
                continue
            timings["first"].append((first - started) * 1000)
            timings["total"].append((ended - started) * 1000)


async def _measure(url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float) -> dict[str, Any]:
    timings: dict[str, Any] = {"first": [], "total": [], "non_2xx": 0, "socket_errors": 0, "no_content": 0}
    started = time.perf_counter()
    until = started + duration
    await asyncio.gather(*(_one_connection(url, body, headers, until, timings) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    first, total = timings["first"], timings["total"]
    return {
        "concurrency": concurrency,
        "streams": len(first),
        "rps": len(first) / elapsed,
        "ttfb_p50_ms": statistics.median(first) if first else 0.0,
        "ttfb_p99_ms": percentile(first, 0.99),
        "total_p50_ms": statistics.median(total) if total else 0.0,
        "non_2xx": timings["non_2xx"],
        # an answer without text counts as an error: the stream did not deliver
        "socket_errors": timings["socket_errors"] + timings["no_content"],
    }


def first_byte(url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float) -> dict[str, Any]:
    """Streams at ``concurrency`` for ``duration`` seconds; medians and p99 in ms."""
    import uvloop

    return uvloop.run(_measure(url, body, {"content-type": "application/json", **headers}, concurrency, duration))


def client_bound(client_rps: float, wrk_rps: float) -> bool:
    """Whether the Python client completed clearly fewer streams per second than wrk did
    on the same target: then its queueing, not the server's, is in the figures."""
    return wrk_rps > 0 and client_rps < CLIENT_BOUND_RATIO * wrk_rps
