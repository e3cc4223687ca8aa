"""Shared fixtures: real services, the fake providers (two Bedrock ones among them) and gateway processes (bundles: ``tests/bundles.py``).

Gateways run as real ``portcullis serve`` processes on free ports and are reached over
real HTTP. PostgreSQL and Redis are the machine's own (``DATABASE_URL`` / ``REDIS_URL``,
or the standard local ports); each test session works in its own database and Redis
key prefix so runs never collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.bundles import write_bundle
from tests.fakes import FakeProvider, free_port

UPSTREAM_KEY = "sk-fake-upstream-key"
OUTCOME_EVENTS = ("request_finished", "request_failed", "request_cancelled", "tokens_counted")


def wait_for(condition: Callable[[], Any], timeout: float = 5.0) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@dataclass
class WebhookReceiver:
    """An operator's endpoint (events' webhooks, a decision-log service): each POST's path,
    raw bytes, body (JSON, or None for bytes that are not) and headers (lower-cased names),
    answered ``statuses`` in turn, then 204."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["content-length"]))
            try:
                body = json.loads(raw)
            except ValueError:  # gzip-compressed, say
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            receiver.received.append({"path": self.path, "body": body, "raw": raw, "headers": headers})
            self.send_response(receiver.statuses.pop(0) if receiver.statuses else 204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver.url = f"http://127.0.0.1:{server.server_port}/hook"
    yield receiver
    server.shutdown()
    server.server_close()


# --- real services ------------------------------------------------------------------------


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A Redis of the test's own, for tests that take it away mid-test."""
    import socket

    server = shutil.which("redis-server")
    assert server, "redis-server is installed by make test's service setup"
    port = free_port()
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline, "the private redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait()


@dataclass(frozen=True)
class Services:
    admin_url: str
    database_url: str  # this session's own, migrated database
    redis_url: str
    redis_prefix: str  # this session's own Redis keyspace

    @contextlib.contextmanager
    def scratch_database(self) -> Iterator[str]:
        """An empty database of its own, dropped afterwards."""
        name = f"portcullis_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield psycopg.conninfo.make_conninfo(self.admin_url, dbname=name)
        finally:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    from portcullis.adapters.store.postgres import PostgresKeyStore

    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    probe = Services(admin_url, "", redis_url, "")
    with probe.scratch_database() as database_url:

        async def migrate() -> None:
            store = await PostgresKeyStore.open(database_url, migrate=True)
            await store.close()

        asyncio.run(migrate())
        yield Services(admin_url, database_url, redis_url, f"portcullis-test-{uuid.uuid4().hex[:8]}:")


# --- fake providers -----------------------------------------------------------------------


@dataclass
class Fakes:
    anthropic_us: FakeProvider
    anthropic_eu: FakeProvider
    openai_main: FakeProvider

    def all(self) -> list[FakeProvider]:
        return [self.anthropic_us, self.anthropic_eu, self.openai_main]


@pytest.fixture(scope="session")
def session_fakes() -> Iterator[Fakes]:
    fakes = Fakes(
        FakeProvider(UPSTREAM_KEY, "anthropic-us").start(),
        FakeProvider(UPSTREAM_KEY, "anthropic-eu").start(),
        FakeProvider(UPSTREAM_KEY, "openai-main").start(),
    )
    yield fakes
    for fake in fakes.all():
        fake.stop()


@pytest.fixture
def fakes(session_fakes: Fakes) -> Fakes:
    for fake in session_fakes.all():
        fake.reset()
    return session_fakes


# Two Bedrock Runtimes in the reference routing's regions (each checks the gateway's SigV4 for its own).
@dataclass
class BedrockFakes:
    apne2: FakeProvider
    usw2: FakeProvider

    def all(self) -> list[FakeProvider]:
        return [self.apne2, self.usw2]


@pytest.fixture(scope="session")
def session_bedrock() -> Iterator[BedrockFakes]:
    fakes = BedrockFakes(
        FakeProvider(UPSTREAM_KEY, "bedrock-apne2", region="ap-northeast-2").start(),
        FakeProvider(UPSTREAM_KEY, "bedrock-usw2", region="us-west-2").start(),
    )
    yield fakes
    for fake in fakes.all():
        fake.stop()


@pytest.fixture
def bedrock(session_bedrock: BedrockFakes, fakes: Fakes) -> BedrockFakes:
    """Both Bedrock fakes reset (and, through ``fakes``, the session's others)."""
    for fake in session_bedrock.all():
        fake.reset()
    return session_bedrock


# --- gateway processes --------------------------------------------------------------------


@dataclass
class GatewayProcess:
    directory: Path
    config_path: Path
    process: subprocess.Popen | None = None
    port: int = 0
    keys: dict[str, str] = field(default_factory=dict)
    certificate: Path | None = None  # set at start when the config's listen.tls serves HTTPS

    @property
    def url(self) -> str:
        return f"{'https' if self.certificate else 'http'}://127.0.0.1:{self.port}"

    @property
    def audit_path(self) -> Path:
        return self.directory / "audit.jsonl"

    @property
    def log_path(self) -> Path:
        return self.directory / "gateway.log"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def audit_records(self) -> list[dict[str, Any]]:

        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

    def records_for(self, request_id: str) -> list[dict[str, Any]]:
        return [r for r in self.audit_records() if r.get("request_id") == request_id]

    def outcome(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The record that closes a request. A stream's is written after its last event
        reached the client, so it may land a moment after the client is done."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.records_for(request_id) if r["event"] in OUTCOME_EVENTS]
            if found or time.monotonic() > deadline:
                assert found, f"no outcome recorded for {request_id}"
                return found[-1]
            time.sleep(0.02)

    def settled(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every record, once each started request has its outcome."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.audit_records()
            started = {r["request_id"] for r in records if r["event"] == "request_started"}
            closed = {r["request_id"] for r in records if r["event"] in OUTCOME_EVENTS}
            if started <= closed or time.monotonic() > deadline:
                return records
            time.sleep(0.02)

    def start(self, env: dict[str, str] | None = None) -> GatewayProcess:
        self.port = self.port or free_port()
        config = yaml.safe_load(self.config_path.read_text())
        config["listen"] = {**config.get("listen", {}), "host": "127.0.0.1", "port": self.port}  # keeps other listen settings
        tls = config["listen"].get("tls")
        self.certificate = (self.config_path.parent / tls["cert_file"]) if tls else None
        self.config_path.write_text(yaml.safe_dump(config))
        log = self.log_path.open("ab")
        environment = {**os.environ, "FAKE_UPSTREAM_KEY": UPSTREAM_KEY, "PORTCULLIS_LOG_LEVEL": "INFO", **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=self.directory,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=0.5, verify=self.trust()).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway did not become ready:\n{self.logs()}")

    def trust(self) -> ssl.SSLContext | bool:
        """What an HTTP client verifies this gateway with: its own certificate when it serves HTTPS."""
        return ssl.create_default_context(cafile=self.certificate) if self.certificate else True

    def signal(self, signum: int = signal.SIGHUP) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def key(self, team: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
        label = f"{team}/{user or ''}"
        if label not in self.keys:
            self.keys[label] = create_key(self.config_path, team, user, env)
        return self.keys[label]


def create_key(config_path: Path, team: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
    """A key made the way an operator makes one: through the store, keeping only its hash."""
    from portcullis.adapters.auth import create_key as make
    from portcullis.adapters.config import load_config
    from portcullis.adapters.store import open_store

    async def run() -> str:
        config = load_config(config_path)
        store = await open_store(config.store, config.max_auth_failures, config.auth_failure_window, migrate=True)
        try:
            return (await make(store, team, user, "test"))[1]
        finally:
            await store.close()

    saved = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})
    try:
        return asyncio.run(run())
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def gateway_config(directory: Path, fakes: Fakes, bundle: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "workers": 1,  # one process, one audit.jsonl; tests of several workers set their own
        "policy": {"bundle": str(bundle), "watch_interval_seconds": 0.2},
        "providers": [
            {
                "name": "anthropic-us",
                "type": "anthropic",
                "base_url": fakes.anthropic_us.url,
                "api_key_env": "FAKE_UPSTREAM_KEY",
                "timeouts": {"connect_seconds": 2, "read_seconds": 3},
            },
            {
                "name": "anthropic-eu",
                "type": "anthropic",
                "base_url": fakes.anthropic_eu.url,
                "api_key_env": "FAKE_UPSTREAM_KEY",
                "timeouts": {"connect_seconds": 2, "read_seconds": 3},
            },
            {
                "name": "openai-main",
                "type": "openai",
                "base_url": f"{fakes.openai_main.url}/v1",
                "api_key_env": "FAKE_UPSTREAM_KEY",
                "timeouts": {"connect_seconds": 2, "read_seconds": 3},
            },
        ],
        "store": {"kind": "embedded", "path": str(directory / "state.db")},
        "audit": {"path": str(directory / "audit.jsonl")},
        "limits": {"max_request_bytes": 262144, "max_attempts": 3},
        "auth": {"key_cache_seconds": 0, "max_failures": 50, "failure_window_seconds": 60},
    }
    for section, value in overrides.items():
        config[section] = {**config.get(section, {}), **value} if isinstance(value, dict) else value
    return config


def new_gateway(directory: Path, fakes: Fakes, bundle: Path | None = None, **overrides: Any) -> GatewayProcess:
    directory.mkdir(parents=True, exist_ok=True)
    bundle = bundle or write_bundle(directory / "bundle")
    config_path = directory / "portcullis.yaml"
    config_path.write_text(yaml.safe_dump(gateway_config(directory, fakes, bundle, **overrides)))
    return GatewayProcess(directory, config_path)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes) -> Iterator[GatewayProcess]:
    """The shared gateway most tests talk to: embedded store, the standard bundle."""
    running = new_gateway(tmp_path_factory.mktemp("gateway"), session_fakes).start()
    yield running
    running.stop()


@pytest.fixture
def fresh_gateway(tmp_path: Path, fakes: Fakes) -> Iterator[Any]:
    """A factory for a gateway of a test's own, stopped when the test ends."""
    started: list[GatewayProcess] = []

    def make(bundle: Path | None = None, env: dict[str, str] | None = None, **overrides: Any) -> GatewayProcess:
        running = new_gateway(tmp_path / f"gw{len(started)}", fakes, bundle, **overrides)
        started.append(running)
        return running.start(env)

    yield make
    for running in started:
        running.stop()
