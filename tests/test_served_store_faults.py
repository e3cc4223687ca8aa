"""The shared store when Redis goes away or restarts. Each test runs its own throwaway
redis-server on a free port and stops or restarts only that one."""

from __future__ import annotations

import asyncio
import collections
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Fakes, Services
from tests.fakes import free_port
from tests.governance_helpers import BODY, budget_cap, headers, ledger_rows, metered_bundle, unique_team
from tests.test_served_store_burst import burst

pytestmark = pytest.mark.served


class ThrowawayRedis:
    """A redis-server of the test's own that can be stopped and started again on its port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ThrowawayRedis:
        server = shutil.which("redis-server")
        assert server, "redis-server is installed by make test's service setup"
        command = [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", self.port)) != 0:
            assert time.monotonic() < deadline, "the throwaway redis-server did not start"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            self.process = None


class SilentHop:
    """A TCP hop in front of Redis (a load balancer, a NAT) that can forget every
    connection without telling the client: the gateway's pooled sockets look healthy
    until a command is written on one, which is then reset — the way a restarted Redis
    behind such a hop looks to its clients."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._generation = 0
        self._upstreams: list[tuple[int, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def forget_connections(self) -> None:
        with self._lock:
            self._generation += 1
            for _, upstream in self._upstreams:
                upstream.close()
            self._upstreams.clear()

    def close(self) -> None:
        self._listener.close()
        self.forget_connections()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            with self._lock:
                generation = self._generation
                self._upstreams.append((generation, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        if from_client:  # the client wrote on a forgotten connection: reset it
            client = source
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        # Redis went away (forgotten): say nothing to the client until it writes.


@pytest.fixture
def own_redis() -> Iterator[ThrowawayRedis]:
    redis = ThrowawayRedis().start()
    yield redis
    redis.stop()


def post(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json=BODY, headers=headers(key), timeout=30)


def test_a_burst_two_seconds_after_a_redis_restart_is_served(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services, own_redis) -> None:
    team = unique_team()
    rules = {f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 1000}}}  # a Block limit: every request needs Redis
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": own_redis.url}
    gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store={"kind": "shared"})
    key = gateway.key(team, env=env)
    before = collections.Counter(asyncio.run(burst([gateway.url], key, 100)))  # fills the pool with connections
    assert before == {200: 100}

    own_redis.stop()
    own_redis.start()  # same port, empty: every pooled connection now points at a dead socket
    time.sleep(2)

    after = collections.Counter(asyncio.run(burst([gateway.url], key, 100)))
    print(f"\nburst 2 s after a Redis restart: {dict(after)}")
    assert after == {200: 100}
    assert len(ledger_rows(services, team)) == 200  # counters reloaded from the ledger, nothing lost


def test_auth_does_not_need_redis(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services, own_redis) -> None:
    capped, free = unique_team(), unique_team()
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": own_redis.url}
    gateway = fresh_gateway(
        bundle=metered_bundle(tmp_path / "b", capped, budget_cap(capped, "5", "CalendarMonth"), extra_teams=(free,)),
        env=env,
        store={"kind": "shared"},
        auth={"key_cache_seconds": 0, "max_failures": 3, "failure_window_seconds": 60},
    )
    capped_key, free_key = gateway.key(capped, env=env), gateway.key(free, env=env)  # never presented while Redis was up
    own_redis.stop()

    served = post(gateway.url, free_key)
    assert served.status_code == 200  # looked up in PostgreSQL; no Block limit, so served unmetered by Redis
    assert [row[1] for row in ledger_rows(services, free)] == ["settled"]  # and still recorded
    refused = post(gateway.url, capped_key)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "api_error"  # a Block limit fails closed
    assert "limits cannot be checked" in refused.json()["error"]["message"]

    # Guessing is still throttled, counted in the process while Redis is away.
    guesses = [post(gateway.url, "pk-not-a-real-key").status_code for _ in range(5)]
    assert guesses == [401, 401, 401, 429, 429]
    assert post(gateway.url, free_key).status_code == 429  # the same address is throttled for every key


def test_connections_a_restart_left_dead_are_retried_once(tmp_path: Path, fresh_gateway, fakes: Fakes, services: Services, own_redis) -> None:
    """The stale connections give no sign until used: only the retry on a connection
    error serves the burst (a pool check at checkout cannot see them)."""
    hop = SilentHop(own_redis.port)
    try:
        team = unique_team()
        rules = {f"{team}-rate": {"subject": {"team": team}, "rate": {"rpm": 1000}}}
        env = {"DATABASE_URL": services.database_url, "REDIS_URL": hop.url}
        # The key stays verified in the process, so the first command after the restart is the reservation's.
        gateway = fresh_gateway(bundle=metered_bundle(tmp_path / "b", team, rules), env=env, store={"kind": "shared"}, auth={"key_cache_seconds": 300})
        key = gateway.key(team, env=env)
        assert collections.Counter(asyncio.run(burst([gateway.url], key, 50))) == {200: 50}
        own_redis.stop()
        own_redis.start()
        hop.forget_connections()
        time.sleep(2)
        after = collections.Counter(asyncio.run(burst([gateway.url], key, 50)))
        assert after == {200: 50}, after
    finally:
        hop.close()
