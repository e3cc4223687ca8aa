from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from portcullis.adapters.config import ConfigError, load_config
from portcullis.adapters.providers import protocol_of
from portcullis.adapters.providers.keys import KeyPool


def write(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


VALID = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}]}
BEDROCK = {"name": "x", "type": "bedrock", "region": "us-east-1"}


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert config.port == 8080 and config.host == "127.0.0.1"
    assert config.bundle_path == tmp_path / "bundle"
    assert config.store.kind == "embedded" and config.max_request_bytes == 16 * 1024 * 1024


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({**VALID, "providers": [{"name": "x", "type": "azure"}]}, "providers[0].type"),
        ({**VALID, "providers": [{"name": "x", "type": "openai"}]}, "providers[0]: 'base_url' is a required property"),
        ({**VALID, "limits": {"max_request_bytes": "big"}}, "limits.max_request_bytes"),
        ({**VALID, "lisen": {}}, "'lisen' was unexpected"),
        ({"providers": VALID["providers"]}, "'policy' is a required property"),
        ({**VALID, "providers": [{"name": "a", "type": "mock"}, {"name": "a", "type": "mock"}]}, "name 'a' is used twice"),
        ({**VALID, "providers": [{"name": "x", "type": "openai", "base_url": "http://h/v1", "wire": "grpc"}]}, "providers[0].wire"),
        ({**VALID, "providers": [{"name": "x", "type": "anthropic", "base_url": "http://h", "wire": "responses"}]}, "wire applies only to type openai"),
        ({**VALID, "providers": [{"name": "x", "type": "bedrock"}]}, "providers[0]: 'region' is a required property"),
        ({**VALID, "providers": [{"name": "x", "type": "bedrock", "region": "Virginia"}]}, "providers[0].region"),
        ({**VALID, "providers": [{**BEDROCK, "endpoint_url": "vpce.local"}]}, "providers[0].endpoint_url"),
        ({**VALID, "providers": [{"name": "x", "type": "anthropic", "base_url": "http://h", "region": "us-east-1"}]}, "region applies only to type bedrock"),
        ({**VALID, "providers": [{"name": "x", "type": "openai", "base_url": "http://h/v1", "endpoint_url": "http://h"}]}, "endpoint_url applies only to"),
        ({**VALID, "providers": [{"name": "x", "type": "mock", "profile": "prod"}]}, "profile applies only to type bedrock"),
        ({**VALID, "providers": [{**BEDROCK, "base_url": "http://h"}]}, "base_url does not apply to type bedrock"),
        ({**VALID, "providers": [{**BEDROCK, "api_key_env": "K"}]}, "'x': api_key_env does not apply to type bedrock"),
        ({**VALID, "providers": [{**BEDROCK, "keys": [{"name": "a"}, {"name": "b", "api_key_file": "k"}]}]}, "'x': keys[1].api_key_file does not apply"),
        ({**VALID, "providers": [{"name": "x", "type": "openai", "base_url": "http://h/v1", "keys": [{"name": "a", "rpm": 5}]}]}, "providers[0].keys[0]"),
    ],
)
def test_invalid_config_names_the_field(tmp_path: Path, document: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_config(write(tmp_path, document))


def test_an_openai_provider_speaks_chat_unless_its_wire_is_responses(tmp_path: Path) -> None:
    chat = {"name": "chat", "type": "openai", "base_url": "http://h/v1"}
    responses = {"name": "responses", "type": "openai", "base_url": "http://h/v1", "wire": "responses"}
    config = load_config(write(tmp_path, {**VALID, "providers": [chat, responses, {"name": "mock", "type": "mock"}]}))
    assert [protocol_of(p) for p in config.providers.values()] == ["openai_chat", "openai_responses", None]


def test_a_bedrock_provider_names_its_region_endpoint_and_profile_and_no_secret(tmp_path: Path) -> None:
    public = {"name": "bedrock-usw2", "type": "bedrock", "region": "us-west-2", "keys": [{"name": "quota-a", "rpm": 50, "tpm": 400_000}]}
    endpoint = "https://vpce-1.bedrock-runtime.ap-northeast-2.vpce.amazonaws.com"
    private = {"name": "bedrock-apne2", "type": "bedrock", "region": "ap-northeast-2", "endpoint_url": endpoint + "/", "profile": "gateway"}
    providers = load_config(write(tmp_path, {**VALID, "providers": [public, private]})).providers
    usw2, apne2 = providers["bedrock-usw2"], providers["bedrock-apne2"]
    assert (usw2.type, usw2.region, usw2.profile, usw2.base_url) == ("bedrock", "us-west-2", None, "https://bedrock-runtime.us-west-2.amazonaws.com")
    assert (apne2.region, apne2.profile, apne2.base_url) == ("ap-northeast-2", "gateway", endpoint)
    # Its keys are capacity only: the pool reads no secret for them.
    pool = KeyPool(usw2, capacity=None)  # type: ignore[arg-type]
    assert [(key.name, key.rpm, key.tpm) for key in usw2.keys] == [("quota-a", 50, 400_000)] and pool.first.secret is None
    assert KeyPool(apne2, capacity=None).first.secret is None  # type: ignore[arg-type]
    assert protocol_of(usw2) == "bedrock_converse"


def test_serve_refuses_to_start_without_aws_credentials_for_a_bedrock_provider(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    path = write(tmp_path, {"policy": {"bundle": str(root / "policies")}, "providers": [{"name": "bedrock-usw2", "type": "bedrock", "region": "us-west-2"}]})
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    command = [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2 and "providers.bedrock-usw2: no AWS credentials found" in result.stderr and "Traceback" not in result.stderr


def test_serve_refuses_to_start_with_an_invalid_config(tmp_path: Path) -> None:
    path = write(tmp_path, {**VALID, "providers": [{"name": "x", "type": "azure"}]})
    result = subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "providers[0].type" in result.stderr and "Traceback" not in result.stderr


def test_missing_provider_secret_stops_start_up(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    path = write(
        tmp_path,
        {
            "policy": {"bundle": str(root / "policies")},
            "providers": [{"name": "mock", "type": "openai", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "PORTCULLIS_TEST_UNSET_SECRET"}],
        },
    )
    result = subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "PORTCULLIS_TEST_UNSET_SECRET is not set" in result.stderr


@pytest.mark.parametrize(
    ("store", "expected"),
    [({}, "process"), ({"kind": "shared"}, "fsync"), ({"kind": "shared", "durability": "process"}, "process"), ({"durability": "fsync"}, "fsync")],
)
def test_durability_unset_keeps_what_each_store_did_before(tmp_path: Path, store: dict, expected: str) -> None:
    """An operator who never wrote store.durability gets the store's old guarantee: the
    embedded store survives a gateway crash, the shared one a database crash; weaker is opt-in."""
    document = {"policy": {"bundle": "policies"}, "providers": [{"name": "p", "type": "openai", "base_url": "http://127.0.0.1:1/v1"}], "store": store}
    assert load_config(write(tmp_path, document)).store.durability == expected
