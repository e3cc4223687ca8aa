"""``portcullis audit``: check the audit log's hash chain."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure, config_path
from portcullis.adapters.config import load_config


def register(commands: Any) -> None:
    audit = commands.add_parser("audit", help="audit log tools").add_subparsers(title="audit commands")
    verify = audit.add_parser("verify", help="check the hash chain (and each worker's chain beside it); exits non-zero at the first bad record")
    verify.add_argument("path", type=Path, nargs="?", help="the audit log (default: the configuration's audit.path)")
    verify.add_argument("--config", "-c", help="verify this configuration's audit.path (found as for policy test)")
    verify.set_defaults(run=_audit_verify)


def _audit_verify(args: argparse.Namespace) -> int:
    from portcullis.adapters.worker import worker_audit_paths

    if args.path is not None and args.config:
        raise Failure("give the audit log's path or --config, not both")
    if args.path is None:
        args.path = Path(os.path.normpath(load_config(config_path(args.config, "audit log")).audit_path))
    # With `workers: N`, each worker keeps its own chain beside the first: each is checked.
    statuses = [_verify_one(path) for path in (args.path, *worker_audit_paths(args.path))]
    return max(statuses)


def _verify_one(path: Path) -> int:
    """One chain: its rotated files, oldest first, then the live one, each continuing the last."""
    from portcullis.adapters.audit_files import chain_files
    from portcullis.engine.audit_chain import GENESIS_HEAD, verify

    files = chain_files(path)
    if not files:
        raise Failure(f"cannot read {path}: no such file")
    start = None  # the oldest file here may follow files shipped away: its first record is taken as given
    records, repairs = 0, []
    for number, file in enumerate(files):
        try:
            with file.open("rb") as handle:
                result = verify(handle, start)
        except OSError as error:
            raise Failure(f"cannot read {file}: {error.strerror}") from None
        records += result.records
        repairs += result.repairs
        if not result.ok:
            print(f"{file}: line {result.bad_line}: {result.problem}")
            print(f"the first {result.records} records of it are intact (last good seq {result.head.seq})")
            return 1
        if number == 0 and result.first_seq not in (None, 1):
            print(f"{file}: starts at seq {result.first_seq}: the files before it are not here")
        if result.records:
            start = result.head
    head = start or GENESIS_HEAD
    rotated = f" in {len(files)} files" if len(files) > 1 else ""
    print(f"{path}: {records} records{rotated}, chain intact (head seq {head.seq}, hash {head.hash[:16]}…)")
    if repairs:
        print(f"torn writes cut at start-up and recorded: {len(repairs)} (audit_repaired at seq {', '.join(map(str, repairs))})")
    return 0
