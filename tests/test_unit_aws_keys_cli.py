"""``portcullis keys create --aws`` and ``keys reseal`` as an operator runs them: the
pair printed once, nothing but the sealed secret in the database, rotation of the seal
key, and a clear refusal without one."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from portcullis.adapters.aws_credentials import SealKeys
from portcullis.adapters.config import ConfigError, load_config
from portcullis.adapters.store import open_store
from tests.bundles import write_bundle

OLD_KEY, NEW_KEY = b"o" * 32, b"n" * 32


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def config_file(tmp_path: Path, seal_env: str | None = "PORTCULLIS_AWS_SEAL_KEY") -> Path:
    document: dict = {
        "policy": {"bundle": str(write_bundle(tmp_path / "bundle"))},
        "providers": [{"name": "mock", "type": "mock"}],
        "store": {"kind": "embedded", "path": str(tmp_path / "store" / "portcullis.db")},
    }
    if seal_env:
        document["auth"] = {"aws_credentials": {"seal_key_env": seal_env}}
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def cli(config: Path, *args: str, seal: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PORTCULLIS_LOG_LEVEL": "WARNING", **({"PORTCULLIS_AWS_SEAL_KEY": seal} if seal is not None else {})}
    return subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", *args, "--config", str(config)], capture_output=True, text=True, env=env, timeout=60
    )


def issue(config: Path, seal: str) -> tuple[str, str, subprocess.CompletedProcess]:
    result = cli(config, "keys", "create", "--aws", "--team", "eng", "--user", "alice", "--name", "ci", seal=seal)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    return lines[0].split("=", 1)[1], lines[1].split("=", 1)[1], result


def test_create_aws_prints_the_pair_once_and_stores_only_its_seal(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    access_key_id, secret, result = issue(config, b64(OLD_KEY))
    assert access_key_id.startswith("PCAK") and len(access_key_id) == 20 and len(secret) == 40
    assert secret not in result.stderr and f"key_id: {access_key_id}" in result.stderr
    listed = cli(config, "keys", "list", seal=b64(OLD_KEY))
    assert access_key_id in listed.stdout and "team=eng" in listed.stdout and "user=alice" in listed.stdout and secret not in listed.stdout
    stored = b"".join(path.read_bytes() for path in (tmp_path / "store").iterdir())  # the file, its WAL and index
    assert access_key_id.encode() in stored and secret.encode() not in stored


def test_revoke_covers_aws_credentials(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    access_key_id, _, _ = issue(config, b64(OLD_KEY))
    assert cli(config, "keys", "revoke", access_key_id).returncode == 0
    assert "revoked" in next(line for line in cli(config, "keys", "list").stdout.splitlines() if line.startswith(access_key_id))
    assert cli(config, "keys", "revoke", access_key_id).returncode == 1  # no longer active


def test_reseal_moves_secrets_to_a_new_key_added_in_front(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    access_key_id, secret, _ = issue(config, b64(OLD_KEY))
    rotated = f"{b64(NEW_KEY)},{b64(OLD_KEY)}"
    result = cli(config, "keys", "reseal", seal=rotated)
    assert result.returncode == 0 and "resealed 1 credential " in result.stdout, result.stderr

    async def unsealed_with_the_new_key_alone() -> str:
        store = await open_store(load_config(config).store, 10, 60)
        try:
            found = await store.keys.find_aws_credential(access_key_id)
            assert found is not None
            return SealKeys([NEW_KEY]).unseal(*found)
        finally:
            await store.close()

    assert asyncio.run(unsealed_with_the_new_key_alone()) == secret
    assert "resealed 0 credentials" in cli(config, "keys", "reseal", seal=rotated).stdout


def test_reseal_without_the_old_key_names_the_credentials_it_cannot_open(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    access_key_id, _, _ = issue(config, b64(OLD_KEY))
    result = cli(config, "keys", "reseal", seal=b64(NEW_KEY))
    assert result.returncode == 1 and access_key_id in result.stderr and "add back the key" in result.stderr


def test_create_aws_without_a_seal_key_refuses_clearly(tmp_path: Path) -> None:
    result = cli(config_file(tmp_path, seal_env=None), "keys", "create", "--aws", "--team", "eng")
    assert result.returncode == 1 and "seal_key_env" in result.stderr and result.stdout == "" and "Traceback" not in result.stderr
    unset = cli(config_file(tmp_path), "keys", "create", "--aws", "--team", "eng")
    assert unset.returncode == 2 and "PORTCULLIS_AWS_SEAL_KEY" in unset.stderr and unset.stdout == ""


@pytest.mark.parametrize("value", ["", "bm90LWJhc2U2NA==", "!!!", f"{b64(NEW_KEY)},"])
def test_a_seal_key_that_is_not_base64_32_bytes_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PORTCULLIS_AWS_SEAL_KEY", value)
    with pytest.raises(ConfigError, match="base64 32-byte keys"):
        load_config(config_file(tmp_path)).aws_credentials.seal_keys()


def test_several_seal_keys_are_read_newest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTCULLIS_AWS_SEAL_KEY", f"{b64(NEW_KEY)}, {b64(OLD_KEY)}")
    assert load_config(config_file(tmp_path)).aws_credentials.seal_keys() == [NEW_KEY, OLD_KEY]
