"""Opening the configured sinks at start-up, and the sources ``audit verify --anchors``
reads back (an HTTP receiver keeps anchors its own way: export them as JSON lines, one
``Anchor.as_record()`` each, and verify against that file)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path

from portcullis.adapters.anchors.base import AnchorSink, AnchorSinkError, AnchorSource
from portcullis.adapters.anchors.file_sink import FileAnchorSource, FileSink
from portcullis.adapters.anchors.http_sink import HttpSink
from portcullis.adapters.anchors.s3_sink import S3AnchorSource, S3Sink
from portcullis.adapters.audit_config import AnchorConfig, FileSinkConfig, HttpSinkConfig, S3SinkConfig, SinkConfig


async def open_sinks(config: AnchorConfig, audit_path: Path, env: Mapping[str, str] | None = None) -> list[AnchorSink]:
    """Every configured sink, ready: its file open, its bucket's Object Lock checked, its
    secrets read from ``env`` (default: the process's environment). The first that cannot
    be opened raises ``AnchorSinkError`` (those opened before it are closed): a gateway
    configured to anchor should not start without knowing its anchors can be kept."""
    opened: list[AnchorSink] = []
    try:
        for entry in config.sinks:
            sink = await _open(entry, audit_path.parent, env)
            opened.append(sink)
            if any(other.name == sink.name for other in opened[:-1]):  # metrics and logs tell sinks apart by name
                raise AnchorSinkError(f"anchor sink {sink.name} is configured twice")
    except BaseException:
        for sink in opened:
            with contextlib.suppress(Exception):
                await sink.close()
        raise
    return opened


async def _open(entry: SinkConfig, audit_directory: Path, env: Mapping[str, str] | None) -> AnchorSink:
    if isinstance(entry, FileSinkConfig):
        return await asyncio.to_thread(FileSink.open, entry, audit_directory)
    if isinstance(entry, S3SinkConfig):
        return await S3Sink.open(entry, env)
    if isinstance(entry, HttpSinkConfig):
        return HttpSink(entry, env)
    raise AnchorSinkError(f"unknown anchor sink {type(entry).__name__}")


def open_anchor_source(source: str, endpoint_url: str | None = None) -> AnchorSource:
    """``s3://bucket/prefix`` (read with the AWS credential chain; ``endpoint_url`` for
    another S3 service), else the path of a file sink's file."""
    if source.startswith("s3://"):
        bucket, _, prefix = source[len("s3://") :].partition("/")
        if not bucket:
            raise AnchorSinkError("an S3 anchor source is s3://<bucket>/<prefix>")
        return S3AnchorSource(bucket, prefix, endpoint_url)
    if endpoint_url:
        raise AnchorSinkError("--endpoint-url is for s3:// anchor sources")
    return FileAnchorSource(Path(source))
