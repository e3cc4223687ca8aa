"""``portcullis capture``: read one body captured for an investigation, and delete the
expired ones."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any

from portcullis.adapters.cli.common import Failure, config_path
from portcullis.adapters.config import Config, ConfigError, load_config


def register(commands: Any) -> None:
    capture = commands.add_parser("capture", help="body captures for investigations").add_subparsers(title="capture commands")
    show = capture.add_parser("show", help="print a captured body (the one sent upstream, masked) to stdout, its metadata to stderr")
    show.add_argument("capture_id", metavar="ID", help="the capture_id of the request's audit record")
    show.add_argument("--config", "-c", help="the configuration whose capture.directory and capture.key_env to use (found as for policy test)")
    show.set_defaults(run=_show)
    purge = capture.add_parser("purge", help="delete the captures older than capture.retention_seconds (needs no key)")
    purge.add_argument("--config", "-c", help="the configuration whose capture section to use (found as for policy test)")
    purge.set_defaults(run=_purge)


def _show(args: argparse.Namespace) -> int:
    from portcullis.adapters.capture import BodyCapture, CaptureConfigError, CaptureError

    config = _config(args)
    try:
        capture = BodyCapture(config.capture, config.capture.key(_vault_key(config)))
    except CaptureConfigError as error:  # a missing key, or a directory that cannot be read
        raise ConfigError(f"{config.source}: {error}") from None
    try:
        captured = capture.read(args.capture_id)
    except CaptureError as error:
        raise Failure(str(error)) from None
    print(
        f"capture {captured.capture_id}: request {captured.request_id}, team {captured.team}, {captured.content_type},"
        f" created {captured.created.isoformat()}, {len(captured.body)} bytes",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stdout.buffer.write(captured.body)  # the bytes as sent upstream, not re-encoded
    sys.stdout.buffer.flush()
    return 0


def _purge(args: argparse.Namespace) -> int:
    from portcullis.adapters.capture import purge_expired

    capture = _config(args).capture
    try:
        deleted, remaining = purge_expired(capture.directory, capture.retention_seconds, datetime.now(UTC))
    except OSError as error:  # a capture this user may not delete: said, not a traceback
        raise Failure(f"{capture.directory}: cannot purge: {error.strerror}") from None
    print(f"{capture.directory}: {deleted} expired capture(s) deleted, {remaining} bytes kept")
    return 0


def _config(args: argparse.Namespace) -> Config:
    return load_config(config_path(args.config, "configuration file"))


def _vault_key(config: Config) -> str | None:
    """The vault's key when this shell has it, for the check that the two differ; an
    investigator need not hold it (the gateway checks at start-up regardless)."""
    if config.pii.vault_key_env is None:
        return None
    return os.environ.get(config.pii.vault_key_env) or None
