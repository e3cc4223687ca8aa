"""`make run`'s configuration: the default bundle and the offline mock provider,
with the key and examples `serve --demo-key` prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.fake_provider import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    directory = tmp_path_factory.mktemp("quickstart")
    config = yaml.safe_load((ROOT / "examples" / "quickstart" / "config.yaml").read_text())
    port = free_port()
    config["listen"]["port"] = port
    config["policy"]["bundle"] = str(ROOT / "policies")
    config["store"]["path"] = str(directory / "state.db")
    config["audit"]["path"] = str(directory / "audit.jsonl")
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    output = directory / "out.txt"
    process = subprocess.Popen(
        [sys.executable, "-m", "portcullis.adapters.cli", "serve", "--config", str(path), "--demo-key", "demo/alice"],
        stdout=output.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PORTCULLIS_LOG_LEVEL": "WARNING"},
    )
    deadline = time.monotonic() + 20
    while "export PORTCULLIS_KEY=" not in output.read_text():
        assert process.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.05)
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    text = output.read_text()
    yield f"http://127.0.0.1:{port}", re.search(r"export PORTCULLIS_KEY=(\S+)", text).group(1), text
    process.terminate()
    process.wait(timeout=10)


def test_printed_examples_name_the_gateway_and_models(quickstart: tuple[str, str, str]) -> None:
    url, _, text = quickstart
    assert f'anthropic.Anthropic(base_url="{url}"' in text and f'openai.OpenAI(base_url="{url}/v1"' in text
    assert '"model": "claude-sonnet-4-5"' in text and '"model": "gpt-4o-mini"' in text


def test_printed_curl_example_works(quickstart: tuple[str, str, str]) -> None:
    url, key, text = quickstart
    command = text[text.index("curl -s " + url + "/v1/messages") :].split("\n\n")[0]
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env={**os.environ, "PORTCULLIS_KEY": key}, timeout=30)
    assert '"type": "message"' in result.stdout, result.stdout + result.stderr


def test_mock_provider_answers_both_protocols(quickstart: tuple[str, str, str]) -> None:
    url, key, _ = quickstart
    claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    assert "mock provider" in claude.messages.create(model="sonnet", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]).content[0].text
    with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert "mock provider" in "".join(stream.text_stream)
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    assert "mock provider" in chat.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content
    chunks = list(chat.chat.completions.create(model="mini", messages=[{"role": "user", "content": "Hi"}], stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens > 0
    # alice's team grants both models; the demo bundle lets user bob only use gpt-4o-mini
    assert {m.id for m in chat.models.list()} == {"claude-sonnet-4-5", "gpt-4o-mini"}
