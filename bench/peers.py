"""Peers for the headline benchmark (`make bench-peers`): LiteLLM's proxy, installed once
into a throwaway venv under ``.bench-peers/`` (git-ignored, never part of the gateway's
environment) and configured against the same fake provider as every other row.

LiteLLM here applies no budgets and no guardrails: its row is what a popular Python
gateway costs for plain forwarding. An install that fails (no network to PyPI, no
wheel) stops the run with the reason, not a half-measured row."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from bench import verdict
from bench.harness import free_port, settled_tree, stop_process
from bench.scenarios import UPSTREAM_KEY
from bench.targets import Target, chat_requests

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".bench-peers"
LITELLM = "litellm[proxy]==1.108.7"
MASTER_KEY = "sk-bench-litellm-master"
START_TIMEOUT = 120  # seconds; it takes ~14 s on two idle cores


def install_litellm(directory: Path = PEERS / "litellm") -> Path:
    """The venv's ``litellm`` command, installing the pinned release on first use."""
    marker = directory / ".installed"
    command = directory / "bin" / "litellm"
    if marker.exists() and marker.read_text() == LITELLM and command.exists():
        return command
    print(f"bench: installing {LITELLM} into {directory} (once; a few minutes) ...", flush=True)
    steps = [[sys.executable, "-m", "venv", str(directory)], [str(directory / "bin" / "pip"), "install", "--quiet", LITELLM]]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            sys.exit(f"bench-peers: installing {LITELLM} failed (exit {result.returncode}); PyPI must be reachable.\n{tail}")
    marker.write_text(LITELLM)
    return command


def litellm_config(fake_url: str, model: str) -> dict[str, object]:
    """One OpenAI-compatible model on the fake, under the name the fake's direct row uses."""
    entry = {"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": f"{fake_url}/v1", "api_key": UPSTREAM_KEY}}
    return {"model_list": [entry], "general_settings": {"master_key": MASTER_KEY}, "litellm_settings": {"telemetry": False}}


@contextmanager
def litellm(fake_url: str, workdir: Path, model: str) -> Iterator[Target]:
    """LiteLLM's proxy serving ``model`` from the fake, ready for load."""
    command = install_litellm()
    config = workdir / "litellm.yaml"
    config.write_text(yaml.safe_dump(litellm_config(fake_url, model)))
    port = free_port()
    log = workdir / "litellm.log"
    # Without our DATABASE_URL / REDIS_URL: LiteLLM would take them for its own database and cache.
    inherited = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "REDIS_URL")}
    environment = {**inherited, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    process = subprocess.Popen(
        [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=workdir,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                sys.exit(f"bench-peers: LiteLLM exited at start-up (exit {process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"bench-peers: LiteLLM did not answer within {START_TIMEOUT} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        requests = chat_requests(model, {"authorization": f"Bearer {MASTER_KEY}"})
        yield Target(verdict.LITELLM, url, requests, processes=len(settled_tree(process.pid)), pid=process.pid)
    finally:
        stop_process(process)
