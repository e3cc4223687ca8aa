"""``portcullis audit verify PATH --anchors SOURCE``, run as the command: an intact log
anchored by the real anchorer passes; a tail cut off after an anchor, or rewritten and
re-sealed into a valid chain, fails though the chain alone passes; a damaged anchor,
a source without the chain's anchors, or several chains and no --chain, fail with a
message saying so; workers' chains are held against their own anchors; an S3 source
(moto on 127.0.0.1) is read as a file is."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from portcullis.adapters.anchors.anchorer import Anchorer
from portcullis.adapters.anchors.sinks import open_sinks
from portcullis.adapters.audit_config import AnchorConfig, FileSinkConfig, S3SinkConfig
from portcullis.adapters.audit_log import AuditLog, AuditWriting
from portcullis.engine.audit_anchors import Anchor
from tests.audit_helpers import MOTO_KEY, MOTO_SECRET, all_records, forge_tail, locked_bucket, moto_s3, s3_admin, write_records

CHAIN = "gw:audit.jsonl"


def portcullis(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def anchored_log(tmp_path: Path, batches: list[int], config: AnchorConfig, name: str = "audit.jsonl", env: dict[str, str] | None = None) -> Path:
    """A log written in ``batches`` of records, the real anchorer anchoring after each one (and at close)."""
    path = tmp_path / name

    async def scenario() -> None:
        log = AuditLog(path, writing=AuditWriting(fsync="never"))
        sinks = await open_sinks(config, path, env)
        anchoring = Anchorer(log, sinks, config)
        for count in batches:
            write_records(log, count)
            await asyncio.gather(*await anchoring.check())
        await anchoring.close()
        log.close()

    asyncio.run(scenario())
    return path


def file_config(tmp_path: Path, chain: str = CHAIN) -> AnchorConfig:
    return AnchorConfig(chain, (FileSinkConfig(tmp_path / "anchors" / "audit.anchors.jsonl"),), every_records=4)


def test_an_intact_anchored_log_passes(tmp_path: Path) -> None:
    path = anchored_log(tmp_path, [4, 4, 2], file_config(tmp_path))
    anchors = tmp_path / "anchors" / "audit.anchors.jsonl"
    assert [json.loads(line)["seq"] for line in anchors.read_text().splitlines()] == [4, 8, 10]
    result = portcullis(str(path), "--anchors", str(anchors))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 anchors of chain gw:audit.jsonl" in result.stdout and "3 checked against the log" in result.stdout
    assert "latest anchor: seq 10" in result.stdout and "0 records after it" in result.stdout
    assert "the log agrees with its anchors" in result.stdout


def test_a_tail_cut_off_after_an_anchor_is_caught(tmp_path: Path) -> None:
    path = anchored_log(tmp_path, [4, 4, 2], file_config(tmp_path))
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:6]))  # seq 7 to 10 removed
    assert portcullis(str(path)).returncode == 0  # the chain alone cannot tell
    result = portcullis(str(path), "--anchors", str(tmp_path / "anchors" / "audit.anchors.jsonl"))
    assert result.returncode == 1
    assert "problem: truncated: the log ends at seq 6, but seq 8 was anchored" in result.stdout


def test_a_rewritten_and_resealed_tail_is_caught(tmp_path: Path) -> None:
    path = anchored_log(tmp_path, [4, 4, 2], file_config(tmp_path))
    forge_tail(path, keep=5, count=5)
    assert portcullis(str(path)).returncode == 0  # a valid chain, of other records
    result = portcullis(str(path), "--anchors", str(tmp_path / "anchors" / "audit.anchors.jsonl"))
    assert result.returncode == 1
    assert "problem: rewritten: record seq 8" in result.stdout and "rewritten: record seq 10" in result.stdout
    assert "seq 4" not in result.stdout.split("problem:", 1)[1]  # the records before the forgery still agree


def test_a_damaged_anchor_fails_the_check(tmp_path: Path) -> None:
    path = anchored_log(tmp_path, [4], file_config(tmp_path))
    anchors = tmp_path / "anchors" / "audit.anchors.jsonl"
    with anchors.open("a") as handle:
        handle.write('{"chain": "gw:audit.jsonl", "seq": 9, "hash": "abc", "ts": "t"}\n')
    result = portcullis(str(path), "--anchors", str(anchors))
    assert result.returncode == 1
    assert "problem: damaged anchor:" in result.stdout and "line 2: hash is not a SHA-256 hex digest" in result.stdout


def test_a_source_without_the_chains_anchors_or_with_several_chains_says_so(tmp_path: Path) -> None:
    path = anchored_log(tmp_path, [3], file_config(tmp_path))
    anchors = tmp_path / "anchors" / "audit.anchors.jsonl"
    result = portcullis(str(path), "--anchors", str(anchors), "--chain", "elsewhere:audit.jsonl")
    assert result.returncode == 1
    assert "holds no anchors of chain elsewhere:audit.jsonl (it holds: gw:audit.jsonl)" in result.stdout
    anchors.write_text(anchors.read_text() + json.dumps(Anchor(1, "a" * 64, "t", "other:audit.jsonl").as_record()) + "\n")
    result = portcullis(str(path), "--anchors", str(anchors))
    assert result.returncode == 1
    assert "several chains; name one with --chain: gw:audit.jsonl, other:audit.jsonl" in result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = portcullis(str(path), "--anchors", str(empty))
    assert result.returncode == 1 and "holds no anchors" in result.stderr
    assert portcullis(str(path), "--chain", CHAIN).returncode == 1  # --chain alone is a mistake, said so


def test_each_workers_chain_is_held_against_its_own_anchors(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    path = anchored_log(tmp_path, [4, 1], config)
    worker = anchored_log(tmp_path, [4, 4], config.for_worker(1), name="audit.w1.jsonl")
    anchors = tmp_path / "anchors" / "audit.anchors.jsonl"
    result = portcullis(str(path), "--anchors", str(anchors))  # the one chain with workers: no --chain needed
    assert result.returncode == 0, result.stdout + result.stderr
    assert "chain gw:audit.jsonl in" in result.stdout and "chain gw:audit.jsonl.w1 in" in result.stdout
    worker.write_bytes(b"".join(worker.read_bytes().splitlines(keepends=True)[:5]))
    result = portcullis(str(path), "--anchors", str(anchors))
    assert result.returncode == 1 and "the log ends at seq 5, but seq 8 was anchored" in result.stdout


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    with moto_s3() as url:
        yield url


def test_an_s3_source_is_read_with_the_aws_credential_chain(tmp_path: Path, s3_url: str) -> None:
    bucket = locked_bucket(s3_admin(s3_url))
    sink = S3SinkConfig(bucket, endpoint_url=s3_url, region="us-east-1", access_key_id_env="ANCHOR_KEY_ID", secret_access_key_env="ANCHOR_SECRET")
    config = AnchorConfig(CHAIN, (sink,), every_records=4)
    path = anchored_log(tmp_path, [4, 4, 1], config, env={"ANCHOR_KEY_ID": MOTO_KEY, "ANCHOR_SECRET": MOTO_SECRET})
    aws = {"AWS_ACCESS_KEY_ID": MOTO_KEY, "AWS_SECRET_ACCESS_KEY": MOTO_SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
    source = f"s3://{bucket}/portcullis-anchors/"
    result = portcullis(str(path), "--anchors", source, "--endpoint-url", s3_url, env=aws)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"3 anchors of chain gw:audit.jsonl in {source}" in result.stdout
    assert all_records(path)[-1]["seq"] == 9
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:7]))
    result = portcullis(str(path), "--anchors", source, "--endpoint-url", s3_url, env=aws)
    assert result.returncode == 1 and "truncated: the log ends at seq 7, but seq 8 was anchored" in result.stdout
