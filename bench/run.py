"""Portcullis benchmark: the gateway beside its baseline, in one run.

    make bench                      # or: .venv/bin/python bench/run.py --duration 5 --concurrency 1,16,64

Prints, for each scenario and concurrency, p50/p99 latency and requests per second
going straight to the fake provider and going through the gateway, the latency the
gateway adds, the gateway's resident memory, and the policy decision latency on a
generated 50-team / 500-user / 40-model bundle with and without the per-bundle index.

Load comes from wrk (a Python load generator tops out below what the gateway serves
on these cores); wrk, the fake provider and the gateway share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bundle_gen  # noqa: E402

UPSTREAM_KEY = "sk-bench-upstream"
CHAT = [{"role": "user", "content": "Summarise the quarterly report in three bullet points."}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        print("installing wrk (Debian package) ...", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, stdout=subprocess.DEVNULL)
        if not shutil.which("wrk"):
            subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, stdout=subprocess.DEVNULL)
        return shutil.which("wrk") or sys.exit("wrk could not be installed")
    sys.exit("bench: wrk is required (apt-get install wrk)")


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"bench: process exited early:\n{log.read_text()}")
        try:
            httpx.get(url, timeout=0.5)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    sys.exit(f"bench: {url} did not come up")


def wrk(wrk_bin: str, url: str, body: dict[str, Any], headers: dict[str, str], connections: int, duration: int, workdir: Path) -> dict[str, float]:
    lines = ['wrk.method = "POST"', f"wrk.body = [==[{json.dumps(body)}]==]"]
    lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in {"content-type": "application/json", **headers}.items()]
    lines.append(
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("RESULT %d %d %d %d %d %d\\n", summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),\n'
        "    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))\n"
        "end"
    )
    script = workdir / "request.lua"
    script.write_text("\n".join(lines))
    threads = min(2, connections)
    result = subprocess.run([wrk_bin, "-t", str(threads), "-c", str(connections), "-d", f"{duration}s", "-s", str(script), url], capture_output=True, text=True)
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT")), None)
    if line is None:
        sys.exit(f"bench: wrk failed:\n{result.stdout}\n{result.stderr}")
    requests, micros, p50, p99, bad_status, socket_errors = map(int, line.split()[1:])
    return {"rps": requests / (micros / 1e6), "p50_ms": p50 / 1000, "p99_ms": p99 / 1000, "errors": bad_status + socket_errors, "requests": requests}


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def decision_latency(bundle: Path, samples: int) -> dict[str, dict[str, float]]:
    """Median and p99 of one decision, with the per-bundle index (as served) and
    without it (the rules matching globs and sorting targets on every request)."""
    import datetime as dt

    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import parse_bundle, read_bundle_files
    from portcullis.engine.rego import Policy

    active = activate(parse_bundle(read_bundle_files(bundle), []), {"fake-anthropic", "fake-openai"}, dt.date.today())
    tenants, catalog, _ = bundle_gen.generate()
    rng = random.Random(11)
    teams = list(tenants["teams"])
    names = list(catalog["models"]) + list(catalog["aliases"])
    inputs = []
    for _ in range(samples):
        team = rng.choice(teams)
        user = rng.choice([None, *tenants["teams"][team]["users"]])
        inputs.append(
            {
                "principal": {"team": team, "user": user, "key_id": "k"},
                "request": {"model": rng.choice(names), "requires": ["streaming", "tools"], "protocol": "openai_chat", "stream": True},
            }
        )
    results = {}
    for label, policy in (("indexed (served)", active.policy), ("no index (baseline)", Policy(active.bundle.modules, active.bundle.data))):
        timings = []
        for document in inputs:
            started = time.perf_counter_ns()
            policy.evaluate("data.portcullis.decision", document)
            timings.append((time.perf_counter_ns() - started) / 1000)
        timings.sort()
        results[label] = {"median_us": statistics.median(timings), "p99_us": timings[int(len(timings) * 0.99)]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--decisions", type=int, default=20000)
    args = parser.parse_args()
    wrk_bin = ensure_wrk()
    levels = [int(c) for c in args.concurrency.split(",")]

    with tempfile.TemporaryDirectory(prefix="portcullis-bench-") as tmp:
        workdir = Path(tmp)
        fake_port, gateway_port = free_port(), free_port()
        fake_log = workdir / "fake.log"
        fake = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fake_provider.py"), "--port", str(fake_port), "--api-key", UPSTREAM_KEY],
            stdout=fake_log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        gateway = None
        try:
            wait_ready(f"http://127.0.0.1:{fake_port}/", fake, fake_log)
            bundle = bundle_gen.write(workdir / "bundle")
            config = {
                "listen": {"host": "127.0.0.1", "port": gateway_port},
                "policy": {"bundle": str(bundle), "watch_interval_seconds": 0},
                "providers": [
                    {"name": "fake-anthropic", "type": "anthropic", "base_url": f"http://127.0.0.1:{fake_port}", "api_key_env": "BENCH_UPSTREAM_KEY"},
                    {"name": "fake-openai", "type": "openai", "base_url": f"http://127.0.0.1:{fake_port}/v1", "api_key_env": "BENCH_UPSTREAM_KEY"},
                ],
                "store": {"kind": "embedded", "path": str(workdir / "state.db")},
                "audit": {"path": str(workdir / "audit.jsonl")},
            }
            config_path = workdir / "portcullis.yaml"
            config_path.write_text(yaml.safe_dump(config))
            env = {**os.environ, "BENCH_UPSTREAM_KEY": UPSTREAM_KEY, "PORTCULLIS_LOG_LEVEL": "WARNING"}
            cli = [sys.executable, "-m", "portcullis.adapters.cli"]
            key = subprocess.run(
                [*cli, "keys", "create", "--config", str(config_path), "--team", "team1"], capture_output=True, text=True, env=env, check=True
            ).stdout.strip()
            gateway_log = workdir / "gateway.log"
            gateway = subprocess.Popen([*cli, "serve", "--config", str(config_path)], stdout=gateway_log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            wait_ready(f"{gateway_url}/healthz", gateway, gateway_log)
            fake_url = f"http://127.0.0.1:{fake_port}"
            anthropic_headers = {"anthropic-version": "2023-06-01"}
            scenarios = [
                (
                    "chat",
                    "/v1/chat/completions",
                    {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64},
                    "gpt-m1-upstream",
                    {"authorization": f"Bearer {UPSTREAM_KEY}"},
                    {"authorization": f"Bearer {key}"},
                ),
                (
                    "chat stream",
                    "/v1/chat/completions",
                    {"model": "gpt-m1", "messages": CHAT, "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}},
                    "gpt-m1-upstream",
                    {"authorization": f"Bearer {UPSTREAM_KEY}"},
                    {"authorization": f"Bearer {key}"},
                ),
                (
                    "messages (alias)",
                    "/v1/messages",
                    {"model": "claude-m0-latest", "messages": CHAT, "max_tokens": 64},
                    "claude-m0-upstream",
                    {"x-api-key": UPSTREAM_KEY, **anthropic_headers},
                    {"x-api-key": key, **anthropic_headers},
                ),
                (
                    "messages stream",
                    "/v1/messages",
                    {"model": "claude-m0", "messages": CHAT, "max_tokens": 64, "stream": True},
                    "claude-m0-upstream",
                    {"x-api-key": UPSTREAM_KEY, **anthropic_headers},
                    {"x-api-key": key, **anthropic_headers},
                ),
            ]
            rows = []
            for name, path, body, upstream_model, direct_headers, gateway_headers in scenarios:
                warm = httpx.post(f"{gateway_url}{path}", json=body, headers=gateway_headers, timeout=10)
                if warm.status_code != 200:
                    sys.exit(f"bench: {name} through the gateway answered {warm.status_code}: {warm.text}")
                for connections in levels:
                    direct = wrk(wrk_bin, f"{fake_url}{path}", {**body, "model": upstream_model}, direct_headers, connections, args.duration, workdir)
                    through = wrk(wrk_bin, f"{gateway_url}{path}", body, gateway_headers, connections, args.duration, workdir)
                    rows.append({"scenario": name, "concurrency": connections, "direct": direct, "gateway": through})
            rss, peak = rss_mb(gateway.pid)
        finally:
            for process in (gateway, fake):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=15)
        decisions = decision_latency(bundle, args.decisions)

    print(f"\nPortcullis benchmark — {os.cpu_count()} cores shared by wrk, the fake provider and the gateway; {args.duration}s per run\n")
    print(
        f"{'scenario':<18}{'conc':>5} | {'direct p50':>10} {'p99':>8} {'req/s':>8} | "
        f"{'gateway p50':>11} {'p99':>8} {'req/s':>8} | {'added p50':>9} {'errors':>6}"
    )
    print("-" * 107)
    for row in rows:
        d, g = row["direct"], row["gateway"]
        print(
            f"{row['scenario']:<18}{row['concurrency']:>5} | {d['p50_ms']:>8.2f}ms {d['p99_ms']:>6.2f}ms {d['rps']:>8.0f} | "
            f"{g['p50_ms']:>9.2f}ms {g['p99_ms']:>6.2f}ms {g['rps']:>8.0f} | {g['p50_ms'] - d['p50_ms']:>7.2f}ms {int(d['errors'] + g['errors']):>6}"
        )
    print(f"\ngateway RSS after the runs: {rss:.0f} MB (peak {peak:.0f} MB)")
    print(f"\npolicy decision, 50 teams / 500 users / 40 models, {args.decisions} mixed requests (regorus, one thread):")
    for label, figures in decisions.items():
        print(f"  {label:<20} median {figures['median_us']:7.1f} µs   p99 {figures['p99_us']:7.1f} µs")
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "latest.json").write_text(json.dumps({"runs": rows, "rss_mb": rss, "peak_rss_mb": peak, "decisions": decisions}, indent=2))


if __name__ == "__main__":
    main()
