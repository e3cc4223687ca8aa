"""The HTTP server choice, measured: the floor proxy and the gateway's ASGI app under
uvicorn (uvloop + httptools, as `portcullis serve` runs it) and under granian 2.8.7
(its Rust HTTP/1 server, uvloop), side by side in one run against the same fake
provider, chat completions streamed and not, at concurrency 1 and 16 (wrk).

    python -m bench.servers --duration 5

The gateway rows run the lifted quickstart pipeline (``bench.quickstart_bundle``) on
the embedded store, one worker, built by ``bench.gateway_asgi`` for both servers (and
``portcullis serve`` itself beside them, for the harness's own cost). This measures;
it does not switch the gateway's server."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,16")
    settings = parser.parse_args(argv)
    levels = [int(c) for c in settings.concurrency.split(",")]
    wrk_bin = ensure_wrk()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="portcullis-bench-servers-") as tmp:
        workdir = Path(tmp)
        fake_port = free_port()
        fake = start_fake(workdir, fake_port)
        try:
            fake_url = f"http://127.0.0.1:{fake_port}"
            bundle = quickstart_bundle.write(workdir / "quickstart")
            upstream = {"authorization": f"Bearer {UPSTREAM_KEY}"}
            floor_requests = chat_requests("gpt-4o-mini-2024-07-18", upstream)

            def load(app: str, server: str, url: str, requests: list[Any]) -> None:
                for request in requests:
                    for connections in levels:
                        row = wrk(wrk_bin, f"{url}{request.path}", request.body, request.headers, connections, settings.duration, workdir)
                        rows.append({"app": app, "server": server, "scenario": request.scenario, "concurrency": connections, **row})
                        figures = f"p50 {row['p50_ms']:7.2f} ms {row['rps']:8.0f} req/s"
                        print(f"  {app:<8} {server:<16} {request.scenario:<12} c={connections:<3} {figures}", flush=True)

            for server in SERVERS:
                port = free_port()
                arguments, environment = floor_proxy.command(port, fake_url, server)
                with serving(arguments, environment, f"http://127.0.0.1:{port}/", workdir / f"floor-{server}.log"):
                    load("floor", server, f"http://127.0.0.1:{port}", floor_requests)
            user = (quickstart_bundle.TEAM, quickstart_bundle.USER)
            for server in (*SERVERS, "portcullis serve"):
                prepared = prepare_gateway(workdir / f"gateway-{server.replace(' ', '-')}", fake_port, bundle, {"kind": "embedded"}, {}, *user)
                requests = chat_requests(quickstart_bundle.CHAT_MODEL, {"authorization": f"Bearer {prepared.key}"})
                target = f"{gateway_asgi.__name__}:app"
                if server == "portcullis serve":
                    arguments = [*CLI, "serve", "--config", str(prepared.config)]
                else:
                    arguments = (granian_command if server == "granian" else uvicorn_command)(prepared.port, target)
                environment = {**prepared.environment, gateway_asgi.CONFIG_ENV: str(prepared.config)}
                with serving(arguments, environment, f"http://127.0.0.1:{prepared.port}/healthz", workdir / f"gateway-{server}.log"):
                    load("gateway", server, f"http://127.0.0.1:{prepared.port}", requests)
        finally:
            stop_process(fake)
    return report(rows, settings.duration)


def report(rows: list[dict[str, Any]], duration: int) -> int:
    print(f"\nHTTP server choice — same run, {duration}s per wrk run (p50 / p99 ms, req/s, errors):")
    for row in rows:
        figures = f"p50 {row['p50_ms']:7.2f}  p99 {row['p99_ms']:7.2f}  {row['rps']:8.0f} req/s  errors {row['errors']}"
        print(f"  {row['app']:<8} {row['server']:<16} {row['scenario']:<12} c={row['concurrency']:<3} {figures}")
    print("\ngranian ÷ uvicorn, req/s (same app, scenario, concurrency):")
    for row in rows:
        if row["server"] != "granian":
            continue
        key = (row["app"], row["scenario"], row["concurrency"])
        base = next(r for r in rows if r["server"] == "uvicorn" and (r["app"], r["scenario"], r["concurrency"]) == key)
        ratio = f"{row['rps'] / base['rps']:5.2f}×  (p50 {row['p50_ms'] - base['p50_ms']:+.2f} ms)"
        print(f"  {row['app']:<8} {row['scenario']:<12} c={row['concurrency']:<3} {ratio}")
    invalid = [row for row in rows if row["errors"]]
    for row in invalid:
        print(f"  INVALID: {row['app']} under {row['server']}, {row['scenario']}, c={row['concurrency']}: {row['errors']} non-2xx or socket errors")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
