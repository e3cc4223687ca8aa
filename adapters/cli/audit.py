"""``portcullis audit``: check the audit log's hash chain (and, with ``--anchors``, hold
it against the anchors kept elsewhere: ``audit_anchors``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure, config_path
from portcullis.adapters.config import load_config
from portcullis.engine.audit_chain import GENESIS_HEAD, ChainHead


def register(commands: Any) -> None:
    audit = commands.add_parser("audit", help="audit log tools").add_subparsers(title="audit commands")
    verify = audit.add_parser("verify", help="check the hash chain (and each worker's chain beside it); exits non-zero at the first bad record")
    verify.add_argument("path", type=Path, nargs="?", help="the audit log (default: the configuration's audit.path)")
    verify.add_argument("--config", "-c", help="verify this configuration's audit.path (found as for policy test)")
    verify.add_argument(
        "--anchors",
        metavar="SOURCE",
        help="also compare the log with its anchors: a file sink's file, or s3://BUCKET/PREFIX (read with the AWS credential chain); "
        "exits non-zero if the log was truncated or rewritten, or an anchor is damaged",
    )
    verify.add_argument("--chain", help="the chain's name in the anchors (default: the only one the source holds); worker k's is NAME.w<k>")
    verify.add_argument("--endpoint-url", help="with an s3:// source: another S3 service (MinIO, a VPC endpoint); AWS_ENDPOINT_URL works too")
    verify.set_defaults(run=_audit_verify)


def _audit_verify(args: argparse.Namespace) -> int:
    from portcullis.adapters.worker import worker_audit_paths

    if args.path is not None and args.config:
        raise Failure("give the audit log's path or --config, not both")
    if args.anchors is None and (args.chain or args.endpoint_url):
        raise Failure("--chain and --endpoint-url go with --anchors")
    if args.path is None:
        args.path = Path(os.path.normpath(load_config(config_path(args.config, "audit log")).audit.path))
    # With `workers: N`, each worker keeps its own chain beside the first: each is checked.
    workers = worker_audit_paths(args.path)
    if args.anchors is not None:
        from portcullis.adapters.cli.audit_anchors import verify_with_anchors

        indexed = [(args.path, 0), *((path, int(path.stem.rsplit(".w", 1)[1])) for path in workers)]
        return verify_with_anchors(indexed, args.anchors, args.chain, args.endpoint_url)
    return max(_verify_one(path) for path in (args.path, *workers))


@dataclass(frozen=True)
class ChainWalk:
    """One chain walked: whether it is intact, where it starts and ends, and the hashes of the seqs asked for."""

    ok: bool
    head: ChainHead
    first_seq: int | None
    found: Mapping[int, str] = field(default_factory=dict)


def _verify_one(path: Path) -> int:
    return 0 if walk_chain(path).ok else 1


def walk_chain(path: Path, wanted: Collection[int] = ()) -> ChainWalk:
    """One chain: its rotated files, oldest first, then the live one, each continuing the last."""
    from portcullis.adapters.audit_files import chain_files
    from portcullis.engine.audit_chain import verify

    files = chain_files(path)
    if not files:
        raise Failure(f"cannot read {path}: no such file")
    start = None  # the oldest file here may follow files shipped away: its first record is taken as given
    records, repairs, first_seq = 0, [], None
    found: dict[int, str] = {}
    for number, file in enumerate(files):
        try:
            with file.open("rb") as handle:
                result = verify(handle, start, wanted)
        except OSError as error:
            raise Failure(f"cannot read {file}: {error.strerror}") from None
        records += result.records
        repairs += result.repairs
        found.update(result.found)
        first_seq = result.first_seq if first_seq is None else first_seq
        if not result.ok:
            print(f"{file}: line {result.bad_line}: {result.problem}")
            print(f"the first {result.records} records of it are intact (last good seq {result.head.seq})")
            return ChainWalk(False, result.head, first_seq, found)
        if number == 0 and result.first_seq not in (None, 1):
            print(f"{file}: starts at seq {result.first_seq}: the files before it are not here")
        if result.records:
            start = result.head
    head = start or GENESIS_HEAD
    rotated = f" in {len(files)} files" if len(files) > 1 else ""
    print(f"{path}: {records} records{rotated}, chain intact (head seq {head.seq}, hash {head.hash[:16]}…)")
    if repairs:
        print(f"torn writes cut at start-up and recorded: {len(repairs)} (audit_repaired at seq {', '.join(map(str, repairs))})")
    return ChainWalk(True, head, first_seq, found)
