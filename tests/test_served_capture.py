"""Body capture end to end: a gateway with capture on keeps the request as its transforms
left it (masked by the PII policy), encrypted, named by the request's started record; the
investigator's `portcullis capture show` opens it; nothing in clear reaches the disk."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Fakes
from tests.fakes import Reply
from tests.pii_helpers import EMAIL, SONNET_UPSTREAM, claude, pii_bundle

pytestmark = pytest.mark.served

KEY_ENV = "PORTCULLIS_TEST_CAPTURE_KEY"


def show(gateway, capture_id: str, key: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "capture", "show", capture_id, "--config", str(gateway.config_path)],
        capture_output=True,
        env={**os.environ, KEY_ENV: key},
    )


def capturing(tmp_path: Path, fresh_gateway, fakes: Fakes, teams: list[str]) -> tuple[Any, str, Path]:
    """A gateway on the PII bundle capturing ``teams``' requests: it, its capture key and directory."""
    key = base64.b64encode(os.urandom(32)).decode()
    directory = tmp_path / "captures"
    gateway = fresh_gateway(
        bundle=pii_bundle(tmp_path / "b"),
        capture={"enabled": True, "key_env": KEY_ENV, "directory": str(directory), "teams": teams},
        env={KEY_ENV: key},
    )
    fakes.anthropic_us.script(SONNET_UPSTREAM, Reply(text="Done."))
    return gateway, key, directory


def test_the_masked_body_is_captured_encrypted_and_opened_by_its_id(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway, key, directory = capturing(tmp_path, fresh_gateway, fakes, ["eng"])
    claude(gateway, gateway.key("eng")).messages.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": f"Write to {EMAIL} today."}]
    )
    [started] = [r for r in gateway.audit_records() if r["event"] == "request_started"]
    capture_id = started["capture_id"]
    [sent] = fakes.anthropic_us.received

    opened = show(gateway, capture_id, key)
    assert opened.returncode == 0, opened.stderr
    assert b"<EMAIL_1>" in opened.stdout and EMAIL.encode() not in opened.stdout  # the masked body, as it left
    # In the client's protocol, before a target is chosen: the upstream body differs only by its model's id.
    assert json.loads(opened.stdout) == {**sent.json, "model": "claude-sonnet-4-5"}
    assert f"request {started['request_id']}, team eng".encode() in opened.stderr

    [stored] = list(directory.iterdir())
    assert stored.name == f"{capture_id}.cap" and stored.stat().st_mode & 0o777 == 0o600
    assert not any(clear in stored.read_bytes() for clear in (b"EMAIL", EMAIL.encode(), b"Write to"))  # nothing in clear

    wrong = show(gateway, capture_id, base64.b64encode(os.urandom(32)).decode())
    assert wrong.returncode != 0 and b"does not open with this key" in wrong.stderr and b"Traceback" not in wrong.stderr


def test_a_team_not_selected_is_not_captured_and_a_missing_key_stops_start_up(tmp_path: Path, fresh_gateway, fakes: Fakes) -> None:
    gateway, _, directory = capturing(tmp_path, fresh_gateway, fakes, ["someone-else"])
    claude(gateway, gateway.key("eng")).messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "Hello"}])
    [started] = [r for r in gateway.audit_records() if r["event"] == "request_started"]
    assert "capture_id" not in started and list(directory.iterdir()) == []

    with pytest.raises(RuntimeError, match=f"capture.key_env: environment variable {KEY_ENV} is not set"):
        fresh_gateway(capture={"enabled": True, "key_env": KEY_ENV}, env={KEY_ENV: ""})
