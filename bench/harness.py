"""What every benchmark drives: wrk, the fake provider, `portcullis serve` processes and
scratch databases. Shared so each bench measures the same way (wrk's counters, the same
fake, the same gateway configuration), and the process tree a gateway runs as, read
from /proc, so a row names how many processes served it and what each one holds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from bench import bundle_gen
from bench.scenarios import UPSTREAM_KEY

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "portcullis.adapters.cli"]
# The gateway signs its Bedrock calls with these (the fake does not check them: wrk cannot sign the baseline's).
BEDROCK_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIABENCH0000000000", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_EC2_METADATA_DISABLED": "true"}


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


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"bench: process exited early:\n{log.read_text()}")
        try:
            httpx.get(url, timeout=0.5)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    sys.exit(f"bench: {url} did not come up")


# wrk's own default is 2 s, which a gateway at c=64 on two shared cores can pass while
# still serving; a slow answer belongs in the latency figures, one that never comes in
# the errors.
WRK_TIMEOUT_SECONDS = 10


def wrk(wrk_bin: str, url: str, body: dict[str, Any], headers: dict[str, str], connections: int, duration: int, workdir: Path) -> dict[str, float]:
    """One wrk run. ``errors`` is wrk's status errors (answers >= 400) plus its socket
    errors (connect, read, write, timeout); ``non_2xx`` and ``socket_errors`` apart, and
    ``timeouts`` (answers slower than ``WRK_TIMEOUT_SECONDS``) among the socket errors."""
    lines = ['wrk.method = "POST"', f"wrk.body = [==[{json.dumps(body)}]==]"]
    lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in {"content-type": "application/json", **headers}.items()]
    lines.append(
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("RESULT %d %d %d %d %d %d %d\\n", summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),\n'
        "    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, summary.errors.timeout))\n"
        "end"
    )
    script = workdir / "request.lua"
    script.write_text("\n".join(lines))
    threads = min(2, connections)
    options = ["-t", str(threads), "-c", str(connections), "-d", f"{duration}s", "--timeout", f"{WRK_TIMEOUT_SECONDS}s", "-s", str(script)]
    result = subprocess.run([wrk_bin, *options, url], capture_output=True, text=True)
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT")), None)
    if line is None:
        sys.exit(f"bench: wrk failed:\n{result.stdout}\n{result.stderr}")
    requests, micros, p50, p99, bad_status, socket_errors, timeouts = map(int, line.split()[1:])
    return {
        "rps": requests / (micros / 1e6),
        "p50_ms": p50 / 1000,
        "p99_ms": p99 / 1000,
        "errors": bad_status + socket_errors,
        "non_2xx": bad_status,
        "socket_errors": socket_errors,
        "timeouts": timeouts,
        "requests": requests,
    }


def start_fake(workdir: Path, port: int, *options: str) -> subprocess.Popen:
    """The fake provider on ``port``, ready to answer."""
    log = workdir / "fake.log"
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes", "--port", str(port), "--api-key", UPSTREAM_KEY, "--unsigned-bedrock", *options],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    wait_ready(f"http://127.0.0.1:{port}/", fake, log)
    return fake


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {name: value.strip() for name, _, value in (line.partition(":") for line in text.splitlines())}


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident and peak resident memory (VmRSS, VmHWM) of one process, in MB."""
    fields = _status(pid)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant (the children each of its threads started)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:  # the task ended while we looked
                continue
    return found


def tree_memory(pid: int) -> list[dict[str, Any]]:
    """RSS and peak RSS of each process of ``pid``'s tree, the process itself first."""
    rows = []
    for member in process_tree(pid):
        try:
            fields = _status(member)
        except OSError:
            continue
        rss, peak = (int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))
        rows.append({"pid": member, "name": fields.get("Name", "?"), "rss_mb": rss, "peak_mb": peak})
    return rows


def settled_tree(pid: int, timeout: float = 10, quiet: float = 0.6) -> list[int]:
    """The process tree once its size has held still for ``quiet`` seconds: a supervisor
    may still be starting workers when the port first answers."""
    deadline = time.monotonic() + timeout
    tree, since = process_tree(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        current = process_tree(pid)
        if len(current) != len(tree):
            tree, since = current, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return tree


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    name = f"portcullis_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def gateway_config(port: int, fake_port: int, bundle: Path, store: dict[str, Any], directory: Path, workers: int | str) -> dict[str, Any]:
    """The configuration every bench gateway runs with: the fake behind each provider type."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "workers": workers,
        "policy": {"bundle": str(bundle), "watch_interval_seconds": 0},
        "providers": [
            {"name": "fake-anthropic", "type": "anthropic", "base_url": f"http://127.0.0.1:{fake_port}", "api_key_env": "BENCH_UPSTREAM_KEY"},
            {"name": bundle_gen.BEDROCK, "type": "bedrock", "region": "us-east-1", "endpoint_url": f"http://127.0.0.1:{fake_port}"},
            {"name": "fake-openai", "type": "openai", "base_url": f"http://127.0.0.1:{fake_port}/v1", "api_key_env": "BENCH_UPSTREAM_KEY"},
            {
                "name": "fake-responses",
                "type": "openai",
                "wire": "responses",
                "base_url": f"http://127.0.0.1:{fake_port}/v1",
                "api_key_env": "BENCH_UPSTREAM_KEY",
            },
        ],
        "store": {**store, "path": str(directory / "state.db")} if store["kind"] == "embedded" else store,
        "audit": {"path": str(directory / "audit.jsonl")},
    }


@dataclass(frozen=True)
class Prepared:
    """A gateway's configuration file, environment and key, ready to serve on ``port``."""

    config: Path
    environment: dict[str, str]
    key: str
    port: int


def prepare_gateway(
    directory: Path,
    fake_port: int,
    bundle: Path,
    store: dict[str, Any],
    env: dict[str, str],
    team: str = "team1",
    user: str | None = None,
    workers: int | str = 1,
) -> Prepared:
    """Write the configuration into ``directory``, migrate a shared store, create a key."""
    port = free_port()
    directory.mkdir()
    path = directory / "portcullis.yaml"
    path.write_text(yaml.safe_dump(gateway_config(port, fake_port, bundle, store, directory, workers)))
    environment = {**os.environ, "BENCH_UPSTREAM_KEY": UPSTREAM_KEY, "PORTCULLIS_LOG_LEVEL": "WARNING", **BEDROCK_CREDENTIALS, **env}
    if store["kind"] == "shared":
        subprocess.run([*CLI, "db", "migrate", "--config", str(path)], capture_output=True, env=environment, check=True)
    owner = ["--team", team] + (["--user", user] if user else [])
    created = subprocess.run([*CLI, "keys", "create", "--config", str(path), *owner], capture_output=True, text=True, env=environment, check=True)
    return Prepared(path, environment, created.stdout.strip(), port)


class Gateway:
    """A `portcullis serve` process on a bundle and a store, with a key for ``team``
    (and ``user``). ``workers`` is written to the configuration as given (1 by default,
    so figures compare run to run); ``processes`` is what actually serves, from /proc."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        fake_port: int,
        bundle: Path,
        store: dict[str, Any],
        env: dict[str, str],
        team: str = "team1",
        user: str | None = None,
        workers: int | str = 1,
    ) -> None:
        directory = workdir / name
        prepared = prepare_gateway(directory, fake_port, bundle, store, env, team, user, workers)
        self.port, self.key, self.workers = prepared.port, prepared.key, workers
        self.url = f"http://127.0.0.1:{self.port}"
        log = directory / "gateway.log"
        serve = [*CLI, "serve", "--config", str(prepared.config)]
        self.process = subprocess.Popen(serve, stdout=log.open("w"), stderr=subprocess.STDOUT, env=prepared.environment, cwd=ROOT)
        wait_ready(f"{self.url}/healthz", self.process, log)
        self.processes = len(settled_tree(self.process.pid))

    def memory(self) -> list[dict[str, Any]]:
        return tree_memory(self.process.pid)

    def stop(self) -> None:
        stop_process(self.process)
