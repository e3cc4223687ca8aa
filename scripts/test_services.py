"""Find or start the PostgreSQL and Redis the test suite talks to.

    eval "$(python scripts/test_services.py start)"   # prints `export REDIS_URL=...` lines
    python scripts/test_services.py stop              # stops only what `start` started

Order of preference for each service: the URL already in the environment, the
machine's own server on its standard port, then a throwaway server in a temporary
directory (installing the Debian packages first when they are missing and apt-get
is usable). PORTCULLIS_TEST_SERVICES=throwaway skips straight to the last. Tests
create their own database and Redis key prefix either way.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATE = Path(".portcullis/test-services.json")


def log(message: str) -> None:
    print(f"test-services: {message}", file=sys.stderr)


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def apt_install(*packages: str) -> None:
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise SystemExit(f"test-services: {', '.join(packages)} missing and apt-get is not usable here; set DATABASE_URL / REDIS_URL")
    log(f"installing {' '.join(packages)}")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=environment, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=environment, stdout=subprocess.DEVNULL)


def as_postgres(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


THROWAWAY = os.environ.get("PORTCULLIS_TEST_SERVICES") == "throwaway"


def start_redis(state: dict) -> str:
    if os.environ.get("REDIS_URL") and not THROWAWAY:
        return os.environ["REDIS_URL"]
    if reachable("127.0.0.1", 6379) and not THROWAWAY:
        return "redis://127.0.0.1:6379/0"
    if not which("redis-server"):
        apt_install("redis-server")
    port = free_port()
    directory = tempfile.mkdtemp(prefix="portcullis-redis-")
    subprocess.run(
        [
            which("redis-server"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--daemonize",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
            "--pidfile",
            f"{directory}/redis.pid",
            "--logfile",
            f"{directory}/redis.log",
        ],
        check=True,
    )
    wait_for("redis", port)
    state["redis"] = {"pidfile": f"{directory}/redis.pid", "directory": directory}
    log(f"started a throwaway redis on port {port}")
    return f"redis://127.0.0.1:{port}/0"


def start_postgres(state: dict) -> str:
    if os.environ.get("DATABASE_URL") and not THROWAWAY:
        return os.environ["DATABASE_URL"]
    if reachable("127.0.0.1", 5432) and not THROWAWAY:
        return "postgresql://postgres@127.0.0.1:5432/postgres"
    if not which("initdb") or not which("pg_ctl"):
        apt_install("postgresql")
    port = free_port()
    directory = tempfile.mkdtemp(prefix="portcullis-pg-")
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    subprocess.run(as_postgres([which("initdb"), "-D", directory, "-U", "postgres", "--auth=trust", "-E", "UTF8"]), check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        as_postgres(
            [which("pg_ctl"), "-D", directory, "-o", f"-p {port} -k {directory} -c listen_addresses=127.0.0.1", "-l", f"{directory}/log", "-w", "start"]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wait_for("postgres", port)
    state["postgres"] = {"directory": directory}
    log(f"started a throwaway postgres on port {port}")
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def wait_for(name: str, port: int) -> None:
    deadline = time.monotonic() + 30
    while not reachable("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise SystemExit(f"test-services: {name} did not start on port {port}")
        time.sleep(0.1)


def start() -> None:
    state: dict = {}
    urls = {"REDIS_URL": start_redis(state), "DATABASE_URL": start_postgres(state)}
    STATE.parent.mkdir(parents=True, exist_ok=True)
    STATE.write_text(json.dumps(state))
    for name, url in urls.items():
        print(f"export {name}='{url}'")


def stop() -> None:
    if not STATE.exists():
        return
    state = json.loads(STATE.read_text())
    if "postgres" in state:
        directory = state["postgres"]["directory"]
        subprocess.run(as_postgres([which("pg_ctl") or "pg_ctl", "-D", directory, "-m", "fast", "stop"]), stdout=subprocess.DEVNULL, check=False)
        shutil.rmtree(directory, ignore_errors=True)
    if "redis" in state:
        pidfile = Path(state["redis"]["pidfile"])
        if pidfile.exists():
            os.kill(int(pidfile.read_text().strip()), 15)
            time.sleep(0.2)
        shutil.rmtree(state["redis"]["directory"], ignore_errors=True)
    STATE.unlink()


if __name__ == "__main__":
    {"start": start, "stop": stop}[sys.argv[1] if len(sys.argv) > 1 else "start"]()
