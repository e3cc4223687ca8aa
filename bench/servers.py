"""The HTTP server choice, measured: the floor proxy and the gateway's ASGI app under
uvicorn (uvloop + httptools, as `portcullis serve` runs it) and under granian 2.8.7
(its Rust HTTP/1 server, uvloop), side by side in one run against the same fake
provider, chat completions streamed and not, at concurrency 1 and 16 (wrk), in rounds
that alternate the servers run by run.

    python -m bench.servers --duration 4 --rounds 2

The gateway rows run the lifted quickstart pipeline (``bench.quickstart_bundle``) on
the embedded store, one worker, built by ``bench.gateway_asgi`` for both servers (and
``portcullis serve`` itself beside them, for the harness's own cost). This measures;
it does not switch the gateway's server."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import floor_proxy, gateway_asgi, quickstart_bundle  # noqa: E402
from bench.harness import CLI, ensure_wrk, free_port, prepare_gateway, start_fake, stop_process, wait_ready, wrk  # noqa: E402
from bench.scenarios import UPSTREAM_KEY  # noqa: E402
from bench.targets import chat_requests  # noqa: E402

SERVERS = ("uvicorn", "granian")


def granian_command(port: int, target: str) -> list[str]:
    server = ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning"]
    return [sys.executable, "-m", "granian", "--interface", "asgi", *server, target]


def uvicorn_command(port: int, target: str) -> list[str]:
    server = ["--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    return [sys.executable, "-m", "uvicorn", *server, target]


@contextmanager
def serving(arguments: list[str], environment: dict[str, str] | None, ready: str, log: Path) -> Iterator[None]:
    process = subprocess.Popen(arguments, stdout=log.open("w"), stderr=subprocess.STDOUT, env=environment, cwd=ROOT)
    try:
        wait_ready(ready, process, log, timeout=60)
        yield
    finally:
        stop_process(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=2, help="rounds alternating the servers run by run (medians are reported)")
    settings = parser.parse_args(argv)
    levels = [int(c) for c in settings.concurrency.split(",")]
    wrk_bin = ensure_wrk()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="portcullis-bench-servers-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        fake_port = free_port()
        stack.callback(stop_process, start_fake(workdir, fake_port))
        fake_url = f"http://127.0.0.1:{fake_port}"
        bundle = quickstart_bundle.write(workdir / "quickstart")
        floor_requests = chat_requests("gpt-4o-mini-2024-07-18", {"authorization": f"Bearer {UPSTREAM_KEY}"})
        # Every server up at once, idle but for the one under load: each round runs them
        # one after the other on the same request, so drift on a shared machine hits all alike.
        served: list[tuple[str, str, str, list[Any]]] = []
        for server in SERVERS:
            port = free_port()
            arguments, environment = floor_proxy.command(port, fake_url, server)
            stack.enter_context(serving(arguments, environment, f"http://127.0.0.1:{port}/", workdir / f"floor-{server}.log"))
            served.append(("floor", server, f"http://127.0.0.1:{port}", floor_requests))
        for server in (*SERVERS, "portcullis serve"):
            user = (quickstart_bundle.TEAM, quickstart_bundle.USER)
            prepared = prepare_gateway(workdir / f"gateway-{server.replace(' ', '-')}", fake_port, bundle, {"kind": "embedded"}, {}, *user)
            if server == "portcullis serve":
                arguments = [*CLI, "serve", "--config", str(prepared.config)]
            else:
                arguments = (granian_command if server == "granian" else uvicorn_command)(prepared.port, f"{gateway_asgi.__name__}:app")
            environment = {**prepared.environment, gateway_asgi.CONFIG_ENV: str(prepared.config)}
            url = f"http://127.0.0.1:{prepared.port}"
            stack.enter_context(serving(arguments, environment, f"{url}/healthz", workdir / f"gateway-{server}.log"))
            served.append(("gateway", server, url, chat_requests(quickstart_bundle.CHAT_MODEL, {"authorization": f"Bearer {prepared.key}"})))
        for round_ in range(settings.rounds):
            for scenario in range(len(floor_requests)):
                for connections in levels:
                    for app, server, url, requests in served:
                        request = requests[scenario]
                        row = wrk(wrk_bin, f"{url}{request.path}", request.body, request.headers, connections, settings.duration, workdir)
                        rows.append({"app": app, "server": server, "scenario": request.scenario, "concurrency": connections, "round": round_, **row})
                        figures = f"p50 {row['p50_ms']:7.2f} ms {row['rps']:8.0f} req/s"
                        print(f"  round {round_ + 1} {app:<8} {server:<16} {request.scenario:<12} c={connections:<3} {figures}", flush=True)
    return report(rows, settings.duration, settings.rounds)


def report(rows: list[dict[str, Any]], duration: int, rounds: int) -> int:
    def key(row: dict[str, Any]) -> tuple[str, str, int]:
        return row["app"], row["scenario"], row["concurrency"]

    print(f"\nHTTP server choice — same run, {rounds} round(s) alternating the servers, {duration}s per wrk run; medians over rounds:")
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["app"], row["server"], row["scenario"], row["concurrency"]), []).append(row)
    for (app, server, scenario, connections), runs in groups.items():
        p50, p99, rps = (statistics.median(run[field] for run in runs) for field in ("p50_ms", "p99_ms", "rps"))
        errors = sum(run["errors"] for run in runs)
        print(f"  {app:<8} {server:<16} {scenario:<12} c={connections:<3} p50 {p50:7.2f}  p99 {p99:7.2f}  {rps:8.0f} req/s  errors {errors}")
    print("\ngranian ÷ uvicorn, req/s (same app, scenario, concurrency; median of the rounds' ratios):")
    for row in rows:
        if row["server"] != "granian" or row["round"] != 0:
            continue
        pairs = [
            (g, u)
            for g in rows
            if g["server"] == "granian" and key(g) == key(row)
            for u in rows
            if u["server"] == "uvicorn" and key(u) == key(row) and u["round"] == g["round"]
        ]
        ratio = statistics.median(g["rps"] / u["rps"] for g, u in pairs)
        added = statistics.median(g["p50_ms"] - u["p50_ms"] for g, u in pairs)
        print(f"  {row['app']:<8} {row['scenario']:<12} c={row['concurrency']:<3} {ratio:5.2f}×  (p50 {added:+.2f} ms)")
    invalid = [row for row in rows if row["errors"]]
    for row in invalid:
        print(f"  INVALID: {row['app']} under {row['server']}, {row['scenario']}, c={row['concurrency']}: {row['errors']} non-2xx or socket errors")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
