from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from portcullis.adapters.config import ConfigError, load_config
from portcullis.adapters.providers import protocol_of


def write(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


VALID = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}]}


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
