"""What the audit log's suites share: records written through a real ``AuditLog``, the
records of a chain read back, and a tail forged the way an attacker holding the disk
would: rewritten and re-sealed, so the chain alone still verifies; and a local S3 with
Object Lock (moto's server) for the anchors' S3 sink."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from portcullis.adapters.audit_files import chain_files
from portcullis.adapters.audit_log import AuditLog
from portcullis.engine.audit_chain import seal

MOTO_KEY, MOTO_SECRET = "moto-test-key-id", "moto-test-secret"  # moto accepts any credentials


def write_records(log: AuditLog, count: int) -> None:
    for n in range(count):
        log.append("request_finished", request_id=f"req_{n}", pad="x" * 200)


def all_records(path: Path) -> list[dict]:
    return [json.loads(line) for file in chain_files(path) for line in file.read_bytes().splitlines()]


def forge_tail(path: Path, keep: int, count: int) -> None:
    """Keep the first ``keep`` records of the (one-file) log at ``path`` and seal ``count``
    forged ones after them: a valid chain whose records after ``keep`` are not the originals."""
    records = all_records(path)
    lines = path.read_bytes().splitlines(keepends=True)[:keep]
    prev = records[keep - 1]["hash"]
    for seq in range(keep + 1, keep + count + 1):
        ts = records[min(seq, len(records)) - 1]["ts"]  # the originals' times: nothing but the content tells them apart
        line, prev = seal({"event": "request_finished", "ts": ts, "request_id": "forged"}, seq, prev)
        lines.append(line)
    path.write_bytes(b"".join(lines))


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """A real S3 endpoint on 127.0.0.1 (moto's server, Object Lock included): its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_admin(endpoint_url: str) -> Any:
    """boto3, as the bucket's owner would use it (moto takes any credentials)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1", aws_access_key_id=MOTO_KEY, aws_secret_access_key=MOTO_SECRET)


def locked_bucket(admin: Any, locked: bool = True) -> str:
    """A fresh bucket, created with Object Lock on (or not)."""
    name = f"anchors-{uuid.uuid4().hex[:12]}"
    admin.create_bucket(Bucket=name, ObjectLockEnabledForBucket=locked)
    return name
