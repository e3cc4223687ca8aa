"""The ``audit`` section of the configuration: where the log is written, when it
rotates, how it reaches the disk, and where its head is anchored. Secrets appear only
as the names of environment variables, read when the sinks are opened."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from portcullis.adapters.audit_log import AuditWriting


@dataclass(frozen=True)
class FileSinkConfig:
    path: Path  # append-only, best on another mount than the log's


@dataclass(frozen=True)
class S3SinkConfig:
    bucket: str  # created with Object Lock enabled
    prefix: str = "portcullis-anchors/"
    region: str | None = None
    endpoint_url: str | None = None
    retention_days: int = 400
    mode: Literal["COMPLIANCE", "GOVERNANCE"] = "COMPLIANCE"
    access_key_id_env: str | None = None  # unset: the AWS credential chain
    secret_access_key_env: str | None = None
    session_token_env: str | None = None


@dataclass(frozen=True)
class HttpSinkConfig:
    url: str
    secret_env: str | None = None  # a Standard Webhooks secret: each anchor is signed
    bearer_token_env: str | None = None
    timeout_seconds: float = 5.0


SinkConfig = FileSinkConfig | S3SinkConfig | HttpSinkConfig


@dataclass(frozen=True)
class AnchorConfig:
    chain: str  # this log's name in the sinks
    sinks: tuple[SinkConfig, ...]
    every_records: int = 1000
    every_seconds: float = 60.0

    def for_worker(self, index: int) -> AnchorConfig:
        """Worker k writes a chain of its own (``audit.w<k>.jsonl``), anchored under its own name."""
        return self if index == 0 else dataclasses.replace(self, chain=f"{self.chain}.w{index}")


@dataclass(frozen=True)
class AuditConfig:
    path: Path
    writing: AuditWriting = field(default_factory=AuditWriting)
    anchor: AnchorConfig | None = None


def audit_config(section: dict[str, Any], resolve: Callable[[str], Path]) -> AuditConfig:
    """From the validated ``audit`` section (``schemas/config.schema.json``)."""
    path = resolve(section.get("path", ".portcullis/audit.jsonl"))
    rotate = section.get("rotate", {})
    writing = AuditWriting(
        rotate_bytes=rotate.get("max_bytes", AuditWriting.rotate_bytes),
        rotate_seconds=rotate.get("max_age_seconds", AuditWriting.rotate_seconds),
        fsync=section.get("fsync", AuditWriting.fsync),
        fsync_interval=section.get("fsync_interval_seconds", AuditWriting.fsync_interval),
    )
    anchor = section.get("anchor")
    if anchor is None:
        return AuditConfig(path, writing)
    return AuditConfig(
        path,
        writing,
        AnchorConfig(
            # Hostname and file name: two gateways anchoring into one bucket keep apart.
            chain=anchor.get("chain") or _chain_name(f"{socket.gethostname()}:{path.name}"),
            sinks=tuple(_sink(entry, resolve) for entry in anchor["sinks"]),
            every_records=anchor.get("every_records", 1000),
            every_seconds=anchor.get("every_seconds", 60.0),
        ),
    )


def _sink(entry: dict[str, Any], resolve: Callable[[str], Path]) -> SinkConfig:
    fields = {name: value for name, value in entry.items() if name != "type"}
    if entry["type"] == "file":
        return FileSinkConfig(resolve(entry["path"]))
    if entry["type"] == "s3":
        return S3SinkConfig(**fields)
    return HttpSinkConfig(**fields)


def _chain_name(text: str) -> str:
    """Only the characters a chain name may hold (a hostname may hold others)."""
    kept = "".join(c if c.isascii() and (c.isalnum() or c in "._:-") else "-" for c in text)
    return kept[:120]  # room for a worker's .w<k>: sinks take names of up to 128
