"""The headline benchmark: the gateway beside upstream direct and the thinnest proxy, in
one run, against the same fast fake provider.

    python -m bench.pipeline --duration 5             # what `make bench` runs first
    python -m bench.pipeline --peers                  # and LiteLLM (`make bench-peers`)

Rows (each non-streaming and streaming chat completion, at each concurrency, by wrk):
- ``direct``: wrk straight to the fake;
- ``floor``: a raw-ASGI aiohttp forwarder under uvicorn (``bench.floor_proxy``);
- ``bare``: the gateway on the quickstart's tenants and catalog with no team policies;
- ``quickstart``: the quickstart's whole pipeline (``bench.quickstart_bundle``: PII,
  prompt integrity, budgets, budget tiers, the cache-domain pin; limits lifted), embedded;
- ``quickstart-shared``: the same on Redis + PostgreSQL (DATABASE_URL / REDIS_URL);
- ``litellm`` (``--peers``): LiteLLM's proxy on the same fake (``bench.peers``).
Gateways run with ``workers: 1`` and ``workers: auto``; a row names the processes that
served it (read from /proc). Streams are also timed to their first content byte
(``bench.first_byte``). A row with any non-2xx or socket error is INVALID, and the run
then exits non-zero. Results go to bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script as well as a module
    sys.path.insert(0, str(ROOT))

from bench import floor_proxy, quickstart_bundle, verdict  # noqa: E402
from bench.first_byte import client_bound, first_byte  # noqa: E402
from bench.harness import Gateway, ensure_wrk, free_port, scratch_database, start_fake, stop_process, tree_memory, wait_ready, wrk  # noqa: E402
from bench.pipeline_report import report  # noqa: E402
from bench.scenarios import UPSTREAM_KEY  # noqa: E402
from bench.targets import Request, Target, chat_requests  # noqa: E402

WARM_REQUESTS = 24  # on fresh connections, so every worker behind a shared port answers before timing


def upstream_model(bundle: Path, model: str) -> str:
    catalog = yaml.safe_load((bundle / "portcullis" / "catalog" / "data.yaml").read_text())
    return catalog["models"][model]["targets"][0]["model"]


def warm(target: Target, request: Request) -> int | None:
    """``WARM_REQUESTS`` on fresh connections; the first refusal's status, or None."""
    for _ in range(WARM_REQUESTS):
        answer = httpx.post(f"{target.url}{request.path}", json=request.body, headers=request.headers, timeout=30)
        if answer.status_code // 100 != 2:
            print(f"bench: {target.name} {request.scenario} warm-up answered {answer.status_code}: {answer.text[:300]}", file=sys.stderr)
            return answer.status_code
    return None


def measure(target: Target, levels: list[int], settings: argparse.Namespace, workdir: Path, rows: list[dict[str, Any]]) -> None:
    """Every request of ``target`` at every concurrency: wrk, then for streams the first byte."""
    wrk_bin = ensure_wrk()
    for request in target.requests:
        if request.path == "/v1/messages" and not settings.messages:
            continue
        refused = warm(target, request)
        for connections in levels:
            row: dict[str, Any] = {"target": target.name, "workers": target.workers, "processes": target.processes, "scenario": request.scenario}
            row["concurrency"] = connections
            if refused:
                rows.append({**row, "refused": refused})
                continue
            row.update(wrk(wrk_bin, f"{target.url}{request.path}", request.body, request.headers, connections, settings.duration, workdir))
            if request.streams and settings.ttfb_duration > 0:
                body = json.dumps(request.body).encode()
                timed = first_byte(f"{target.url}{request.path}", body, request.headers, connections, settings.ttfb_duration)
                row["first_byte"] = {**timed, "client_bound": client_bound(timed["rps"], row["rps"])}
            rows.append(row)
            print(
                f"  {target.name:<18} {target.workers:>4} {request.scenario:<16} c={connections:<3} p50 {row['p50_ms']:7.2f} ms {row['rps']:8.0f} req/s",
                flush=True,
            )


@contextmanager
def floor(fake_url: str, workdir: Path, requests: list[Request]) -> Iterator[Target]:
    port = free_port()
    log = workdir / "floor.log"
    process = floor_proxy.start(port, fake_url, "uvicorn", log.open("w"), str(ROOT))
    try:
        wait_ready(f"http://127.0.0.1:{port}/", process, log)
        yield Target(verdict.FLOOR, f"http://127.0.0.1:{port}", requests, pid=process.pid)
    finally:
        stop_process(process)


@dataclass(frozen=True)
class GatewaySpec:
    name: str
    bundle: Path
    store: dict[str, Any]
    env: dict[str, str]


def gateway_specs(workdir: Path, database_url: str | None, redis_url: str) -> list[GatewaySpec]:
    lifted = quickstart_bundle.write(workdir / "quickstart")
    bare = quickstart_bundle.write_bare(workdir / "bare")
    specs = [GatewaySpec(verdict.BARE, bare, {"kind": "embedded"}, {}), GatewaySpec(verdict.QUICKSTART, lifted, {"kind": "embedded"}, {})]
    if database_url:
        shared = {"kind": "shared", "redis_prefix": f"portcullis-bench-{uuid.uuid4().hex[:6]}:"}
        specs.append(GatewaySpec(verdict.QUICKSTART_SHARED, lifted, shared, {"DATABASE_URL": database_url, "REDIS_URL": redis_url}))
    return specs


def run_gateways(
    specs: list[GatewaySpec],
    worker_settings: list[str],
    fake_port: int,
    workdir: Path,
    measure_target: Callable[[Target], None],
    gateways: list[dict[str, Any]],
) -> None:
    """Each gateway at each workers setting; ``auto`` is skipped (and said so) when it
    runs as many processes as ``1`` did: until workers are implemented it is the same row."""
    for spec in specs:
        single: int | None = None
        for workers in worker_settings:
            setting: int | str = int(workers) if workers.isdigit() else workers
            gateway = Gateway(
                workdir, f"{spec.name}-w{workers}", fake_port, spec.bundle, spec.store, spec.env, quickstart_bundle.TEAM, quickstart_bundle.USER, setting
            )
            try:
                if workers != "1" and single is not None and gateway.processes == single:
                    gateways.append({"target": spec.name, "workers": workers, "processes": gateway.processes, "skipped": True, "memory": []})
                    continue
                single = gateway.processes if workers == "1" else single
                bearer = {"authorization": f"Bearer {gateway.key}"}
                anthropic = {"x-api-key": gateway.key, "anthropic-version": "2023-06-01"}
                requests = chat_requests(quickstart_bundle.CHAT_MODEL, bearer, quickstart_bundle.MESSAGES_MODEL, anthropic)
                target = Target(spec.name, gateway.url, requests, workers, gateway.processes, gateway.process.pid)
                measure_target(target)
                gateways.append({"target": spec.name, "workers": workers, "processes": gateway.processes, "skipped": False, "memory": gateway.memory()})
            finally:
                gateway.stop()


def run(settings: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in settings.concurrency.split(",")]
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    rows: list[dict[str, Any]] = []
    gateways: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="portcullis-bench-pipeline-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        wanted = set(settings.targets.split(",")) | ({verdict.LITELLM} if settings.peers else set())
        shared = verdict.QUICKSTART_SHARED in wanted and not settings.no_shared
        database_url = stack.enter_context(scratch_database(admin_url)) if shared else None
        fake_port = free_port()
        fake = start_fake(workdir, fake_port)
        stack.callback(stop_process, fake)
        fake_url = f"http://127.0.0.1:{fake_port}"
        specs = gateway_specs(workdir, database_url, redis_url)
        model = upstream_model(specs[1].bundle, quickstart_bundle.CHAT_MODEL)
        messages_model = upstream_model(specs[1].bundle, quickstart_bundle.MESSAGES_MODEL)
        specs = [spec for spec in specs if spec.name in wanted]
        upstream_bearer = {"authorization": f"Bearer {UPSTREAM_KEY}"}
        upstream_anthropic = {"x-api-key": UPSTREAM_KEY, "anthropic-version": "2023-06-01"}

        def measure_target(target: Target) -> None:
            measure(target, levels, settings, workdir, rows)

        print(f"headline benchmark: {settings.duration}s per wrk run, concurrency {settings.concurrency}", flush=True)
        upstream_requests = chat_requests(model, upstream_bearer, messages_model, upstream_anthropic)
        if verdict.DIRECT in wanted:
            measure_target(Target(verdict.DIRECT, fake_url, upstream_requests))
        if verdict.FLOOR in wanted:
            with floor(fake_url, workdir, upstream_requests) as floor_target:
                measure_target(floor_target)
                memory = tree_memory(floor_target.pid or 0)
                gateways.append({"target": verdict.FLOOR, "workers": "-", "processes": 1, "skipped": False, "memory": memory})
        run_gateways(specs, settings.workers.split(","), fake_port, workdir, measure_target, gateways)
        if verdict.LITELLM in wanted:
            from bench.peers import litellm

            with litellm(fake_url, workdir, model) as peer:
                measure_target(peer)
                gateways.append(
                    {"target": verdict.LITELLM, "workers": "-", "processes": peer.processes, "skipped": False, "memory": tree_memory(peer.pid or 0)}
                )
    for row in rows:
        row["invalid"] = verdict.invalid_reasons(row)
    return {"duration_s": settings.duration, "cores": os.cpu_count(), "rows": rows, "gateways": gateways}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--ttfb-duration", type=float, default=3, help="seconds of streams timed to their first content byte per row (0: none)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--workers", default="1,auto", help="the gateways' workers settings, comma-separated")
    every = ",".join((verdict.DIRECT, verdict.FLOOR, *verdict.GATEWAYS))
    parser.add_argument("--targets", default=every, help=f"which rows, comma-separated (default {every}; also {verdict.LITELLM})")
    parser.add_argument("--messages", action="store_true", help="Anthropic Messages rows too (streamed and not)")
    parser.add_argument("--no-shared", action="store_true", help="skip the Redis + PostgreSQL rows")
    parser.add_argument("--peers", action="store_true", help="add LiteLLM's row (installs it into .bench-peers/ once)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "pipeline.json")
    settings = parser.parse_args(argv)
    document = run(settings)
    targets = verdict.goals(document["rows"], document["gateways"])
    document["goals"] = [{"name": goal.name, "value": goal.value, "limit": goal.limit, "passed": goal.passed} for goal in targets]
    settings.output.parent.mkdir(parents=True, exist_ok=True)
    settings.output.write_text(json.dumps(document, indent=2))
    return report(document)


if __name__ == "__main__":
    sys.exit(main())
