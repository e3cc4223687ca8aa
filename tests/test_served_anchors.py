"""Audit anchoring from a running gateway: the chain's head reaches an append-only file and
an S3 bucket with Object Lock (a local moto server) as records are written and once more
as the gateway stops; `audit verify --anchors` then vouches for the log, and catches it
cut short. A bucket without Object Lock stops start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.audit_helpers import MOTO_KEY, MOTO_SECRET, all_records, locked_bucket, moto_s3, s3_admin
from tests.conftest import free_port, wait_for
from tests.metrics_helpers import only

pytestmark = pytest.mark.served

HI = {"model": "haiku", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
S3_ENV = {"ANCHOR_KEY_ID": MOTO_KEY, "ANCHOR_SECRET": MOTO_SECRET}


def s3_sink(endpoint_url: str, bucket: str) -> dict:
    return {
        "type": "s3",
        "bucket": bucket,
        "region": "us-east-1",
        "endpoint_url": endpoint_url,
        "retention_days": 1,
        "access_key_id_env": "ANCHOR_KEY_ID",
        "secret_access_key_env": "ANCHOR_SECRET",
    }


def verify(log: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "portcullis.adapters.cli", "audit", "verify", str(log), "--anchors", source, *options]
    return subprocess.run(
        command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": MOTO_KEY, "AWS_SECRET_ACCESS_KEY": MOTO_SECRET}
    )


def test_the_head_is_anchored_to_a_file_and_a_locked_bucket_and_verify_uses_them(tmp_path: Path, fresh_gateway) -> None:
    anchors = tmp_path / "elsewhere" / "anchors.jsonl"
    with moto_s3() as endpoint:
        admin = s3_admin(endpoint)
        bucket = locked_bucket(admin)
        gateway = fresh_gateway(
            audit={
                "path": str(tmp_path / "gw-audit" / "audit.jsonl"),
                "anchor": {"chain": "gw-1", "every_records": 2, "sinks": [{"type": "file", "path": str(anchors)}, s3_sink(endpoint, bucket)]},
            },
            telemetry={"metrics": {"listen": {"host": "127.0.0.1", "port": (port := free_port())}}},
            env=S3_ENV,
        )
        log = tmp_path / "gw-audit" / "audit.jsonl"
        headers = {"x-api-key": gateway.key("eng"), "anthropic-version": "2023-06-01"}
        for expected in (1, 2):  # a request writes two records: each batch is due (every_records 2) at the next check
            assert httpx.post(f"{gateway.url}/v1/messages", json=HI, headers=headers).status_code == 200
            assert wait_for(lambda n=expected: anchors.exists() and len(anchors.read_text().splitlines()) >= n, timeout=10)
        # Both sinks caught up with the head (the check after the last request's records).
        sinks = (f"file:{anchors}", f"s3://{bucket}/portcullis-anchors/")
        scraped = lambda: httpx.get(f"http://127.0.0.1:{port}/metrics").text  # noqa: E731
        assert wait_for(lambda: all(only(scraped(), "portcullis_audit_anchor_lag", sink=sink) == 0 for sink in sinks), timeout=5)
        metrics = scraped()
        for sink in sinks:
            assert only(metrics, "portcullis_audit_anchor_failing", sink=sink) == 0
            assert only(metrics, "portcullis_audit_anchor_failures_total", sink=sink) == 0
        assert MOTO_SECRET not in metrics
        gateway.stop()  # the final head is anchored as the gateway stops

        records = all_records(log)
        written = [json.loads(line) for line in anchors.read_text().splitlines()]
        assert written[-1] == {"chain": "gw-1", "seq": records[-1]["seq"], "hash": records[-1]["hash"], "ts": written[-1]["ts"]}
        assert [a["seq"] for a in written] == sorted({a["seq"] for a in written})  # one line per anchor, in order
        keys = [o["Key"] for o in admin.list_objects_v2(Bucket=bucket)["Contents"]]
        assert f"portcullis-anchors/gw-1/{records[-1]['seq']:020d}-{records[-1]['hash']}.json" in keys
        head = admin.head_object(Bucket=bucket, Key=keys[-1])
        assert head["ObjectLockMode"] == "COMPLIANCE" and head["ObjectLockRetainUntilDate"]

        sources = ((str(anchors),), (f"s3://{bucket}/portcullis-anchors/", "--endpoint-url", endpoint))
        for source in sources:
            checked = verify(log, *source)
            assert checked.returncode == 0, checked.stdout + checked.stderr

        # Cut the last records: the chain alone still holds, the anchors do not.
        lines = log.read_bytes().splitlines(keepends=True)
        log.write_bytes(b"".join(lines[:-2]))
        for source in sources:
            cut = verify(log, *source)
            assert cut.returncode == 1 and "truncated" in cut.stdout + cut.stderr, cut.stdout + cut.stderr


def test_a_bucket_without_object_lock_stops_start_up(tmp_path: Path, fresh_gateway) -> None:
    with moto_s3() as endpoint:
        bucket = locked_bucket(s3_admin(endpoint), locked=False)
        with pytest.raises(RuntimeError) as failed:
            fresh_gateway(audit={"anchor": {"sinks": [s3_sink(endpoint, bucket)]}}, env=S3_ENV)
    message = str(failed.value)
    assert "audit.anchor" in message and "Object Lock" in message and "Traceback" not in message and MOTO_SECRET not in message
