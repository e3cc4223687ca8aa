"""The ``audit`` section: rotation, the fsync policy and the anchor sinks, parsed from a
configuration file into what the log and the anchorer are built from."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from portcullis.adapters.audit_config import FileSinkConfig, HttpSinkConfig, S3SinkConfig
from portcullis.adapters.audit_log import AuditWriting
from portcullis.adapters.config import ConfigError, load_config

BASE = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}]}


def load(tmp_path: Path, audit: dict):
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump({**BASE, "audit": audit}))
    return load_config(path).audit


def test_unset_the_log_rotates_at_256_mib_syncs_each_second_and_is_not_anchored(tmp_path: Path) -> None:
    audit = load(tmp_path, {})
    assert audit.path == tmp_path / ".portcullis" / "audit.jsonl"
    assert audit.writing == AuditWriting() and audit.writing.rotate_bytes == 256 * 1024 * 1024 and audit.writing.fsync == "interval"
    assert audit.anchor is None


def test_rotation_and_fsync_are_read_from_the_file(tmp_path: Path) -> None:
    audit = load(tmp_path, {"path": "logs/a.jsonl", "rotate": {"max_bytes": 0, "max_age_seconds": 3600}, "fsync": "always", "fsync_interval_seconds": 2.5})
    assert audit.path == tmp_path / "logs" / "a.jsonl"
    assert audit.writing == AuditWriting(rotate_bytes=0, rotate_seconds=3600, fsync="always", fsync_interval=2.5)


def test_anchor_sinks_of_each_kind_and_the_default_chain_name(tmp_path: Path) -> None:
    audit = load(
        tmp_path,
        {
            "anchor": {
                "every_records": 10,
                "sinks": [
                    {"type": "file", "path": "/mnt/anchors/gw.jsonl"},
                    {"type": "s3", "bucket": "audit-anchors", "region": "eu-west-1", "access_key_id_env": "AK", "secret_access_key_env": "SK"},
                    {"type": "http", "url": "https://anchors.example/v1", "secret_env": "ANCHOR_WEBHOOK_SECRET"},
                ],
            }
        },
    )
    anchor = audit.anchor
    assert anchor is not None and anchor.every_records == 10 and anchor.every_seconds == 60
    assert anchor.sinks == (
        FileSinkConfig(Path("/mnt/anchors/gw.jsonl")),
        S3SinkConfig("audit-anchors", region="eu-west-1", access_key_id_env="AK", secret_access_key_env="SK"),
        HttpSinkConfig("https://anchors.example/v1", secret_env="ANCHOR_WEBHOOK_SECRET"),
    )
    assert anchor.chain.endswith(":audit.jsonl") and anchor.chain.startswith(socket.gethostname()[:10].replace("_", "-"))
    assert anchor.for_worker(0).chain == anchor.chain and anchor.for_worker(2).chain == anchor.chain + ".w2"


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"fsync": "sometimes"}, "audit.fsync"),
        ({"fsync_interval_seconds": 0.1}, "audit.fsync_interval_seconds"),
        ({"anchor": {"chain": "c" * 121, "sinks": [{"type": "file", "path": "x"}]}}, "audit.anchor.chain"),
        ({"rotate": {"max_bytes": -1}}, "audit.rotate.max_bytes"),
        ({"rotate": {"every": 5}}, "'every' was unexpected"),
        ({"anchor": {"sinks": []}}, "audit.anchor.sinks"),
        ({"anchor": {"chain": "a b", "sinks": [{"type": "file", "path": "x"}]}}, "audit.anchor.chain"),
        ({"anchor": {"sinks": [{"type": "s3"}]}}, "audit.anchor.sinks"),
        ({"anchor": {"sinks": [{"type": "ftp", "path": "x"}]}}, "audit.anchor.sinks"),
        ({"anchor": {"sinks": [{"type": "s3", "bucket": "b-1", "mode": "LEGAL"}]}}, "audit.anchor.sinks"),
    ],
)
def test_a_bad_audit_setting_names_its_field(tmp_path: Path, audit: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load(tmp_path, audit)
