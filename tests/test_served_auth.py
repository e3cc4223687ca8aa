"""Stage 1: every way authentication can fail, in each protocol's own error format,
with the embedded store and with the shared one (PostgreSQL keys, Redis counters)."""

from __future__ import annotations

import os
import subprocess
import sys

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Fakes, GatewayProcess, Services, create_key, new_gateway

pytestmark = pytest.mark.served

HI = [{"role": "user", "content": "Hi"}]
MESSAGE = {"model": "haiku", "max_tokens": 8, "messages": HI}


def post_messages(gateway: GatewayProcess, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/messages", json=MESSAGE, headers={"anthropic-version": "2023-06-01", **headers})


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing API key"),
        ({"x-api-key": "not-a-portcullis-key"}, "invalid API key"),
        ({"x-api-key": "pk-" + "A" * 43}, "invalid API key"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "missing API key"),
        ({"authorization": "Bearer"}, "missing API key"),
    ],
)
def test_authentication_failures_are_401_in_anthropic_format(gateway: GatewayProcess, fakes: Fakes, headers: dict[str, str], message: str) -> None:
    response = post_messages(gateway, headers)
    assert response.status_code == 401
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "authentication_error"
    assert message in response.json()["error"]["message"]
    assert not fakes.anthropic_eu.received


def test_authentication_failure_in_openai_format(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.AuthenticationError) as failed:
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="pk-wrong", max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=HI)
    assert failed.value.code == "invalid_api_key"


def test_revoked_key_is_refused(fresh_gateway, fakes: Fakes) -> None:
    gateway = fresh_gateway()
    key = gateway.key("eng")
    assert post_messages(gateway, {"x-api-key": key}).status_code == 200
    listed = subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "keys", "list", "--config", str(gateway.config_path)], capture_output=True, text=True, check=True
    )
    key_id = listed.stdout.split()[0]
    assert key not in listed.stdout  # listing never shows secrets
    subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "keys", "revoke", key_id, "--config", str(gateway.config_path)], check=True, capture_output=True
    )
    response = post_messages(gateway, {"x-api-key": key})
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]


def test_key_of_a_team_the_bundle_does_not_know_is_forbidden(gateway: GatewayProcess, fakes: Fakes) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key("ghost-team"), max_retries=0).messages.create(**MESSAGE)
    assert "team" in refused.value.body["error"]["message"]
    assert not fakes.anthropic_eu.received


def test_repeated_failures_from_one_client_are_throttled(fresh_gateway) -> None:
    gateway = fresh_gateway(auth={"max_failures": 3, "failure_window_seconds": 60})
    good = gateway.key("eng")
    statuses = [post_messages(gateway, {"x-api-key": "pk-guess"}).status_code for _ in range(4)]
    assert statuses == [401, 401, 401, 429]
    throttled = post_messages(gateway, {"x-api-key": good})  # even a good key waits out the window
    assert throttled.status_code == 429
    assert throttled.json()["error"]["type"] == "rate_limit_error"
    assert 0 < int(throttled.headers["retry-after"]) <= 60


def test_shared_store_keys_in_postgres_and_throttling_in_redis(fresh_gateway, fakes: Fakes, services: Services) -> None:
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url}
    store = {"kind": "shared", "redis_prefix": services.redis_prefix + "auth:"}
    migrate = subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "db", "migrate", "--config", "/dev/null"], capture_output=True, text=True)
    assert migrate.returncode == 2  # a config that is not one is refused, naming the problem
    gateway_a = fresh_gateway(env=env, store=store, auth={"max_failures": 2, "failure_window_seconds": 30})
    gateway_b = fresh_gateway(env=env, store=store, auth={"max_failures": 2, "failure_window_seconds": 30})
    key = create_key(gateway_a.config_path, "eng", None, env)
    assert post_messages(gateway_b, {"x-api-key": key}).status_code == 200  # a key made once works on every replica
    assert post_messages(gateway_a, {"x-api-key": "pk-bad"}).status_code == 401
    assert post_messages(gateway_b, {"x-api-key": "pk-bad"}).status_code == 401
    assert post_messages(gateway_a, {"x-api-key": key}).status_code == 429  # the failure count is shared


def test_shared_store_requires_a_migrated_schema(tmp_path, fakes: Fakes, services: Services) -> None:
    with services.scratch_database() as url:
        env = {"DATABASE_URL": url, "REDIS_URL": services.redis_url}
        gateway = new_gateway(tmp_path / "gw", fakes, store={"kind": "shared"})
        with pytest.raises(RuntimeError, match="portcullis db migrate"):
            gateway.start(env)
        migrate = subprocess.run(
            [sys.executable, "-m", "portcullis.adapters.cli", "db", "migrate", "--config", str(gateway.config_path)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert migrate.returncode == 0, migrate.stderr
        assert "0001_keys.sql" in migrate.stdout
        gateway.start(env)
        gateway.stop()


def test_redis_down_does_not_stop_key_verification(fresh_gateway, services: Services) -> None:
    """The failure throttle is a defence, not a gate: without Redis, keys are still checked
    against PostgreSQL (a wrong one is a 401, not a 503) and failures counted in-process."""
    env = {"DATABASE_URL": services.database_url, "REDIS_URL": "redis://127.0.0.1:1/0"}
    gateway = fresh_gateway(env=env, store={"kind": "shared"})
    response = post_messages(gateway, {"x-api-key": "pk-anything"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
