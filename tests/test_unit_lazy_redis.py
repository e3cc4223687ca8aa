"""A gateway on the embedded store never imports redis (~7 MB resident per process,
measured); on the shared store its error classes are the ones caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis.exceptions
import yaml

from portcullis.adapters.store import redis_errors

ROOT = Path(__file__).resolve().parents[1]

BUILD = """
import asyncio, pathlib, sys
from portcullis.adapters.config import load_config
from portcullis.adapters.runtime import build_runtime

async def main():
    runtime = await build_runtime(load_config(pathlib.Path(sys.argv[1])))
    print(sorted(name for name in sys.modules if name == "redis" or name.startswith("redis.")))

asyncio.run(main())
"""


def test_the_embedded_store_runs_without_importing_redis(tmp_path: Path) -> None:
    config = {
        "listen": {"host": "127.0.0.1", "port": 8080},
        "policy": {"bundle": str(ROOT / "policies"), "watch_interval_seconds": 0},
        "providers": [{"name": "mock", "type": "mock"}],
        "store": {"kind": "embedded", "path": str(tmp_path / "state.db")},
        "audit": {"path": str(tmp_path / "audit.jsonl")},
        "workers": 1,
    }
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(config))
    built = subprocess.run([sys.executable, "-c", BUILD, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.strip() == "[]", built.stdout


def test_the_shared_stores_objects_catch_redis_own_errors() -> None:
    assert redis_errors.RedisError is redis.exceptions.RedisError
    assert redis_errors.ResponseError is redis.exceptions.ResponseError
    assert issubclass(redis.exceptions.ConnectionError, redis_errors.RedisError)
