"""``portcullis policy diff OLD NEW --inputs decisions.jsonl``: the recorded decisions a
bundle change would flip, before it ships (``engine/policy_diff.py`` decides and sorts;
this reads the decision logs, loads both bundles and reports).

The inputs are OPA decision-log events, as Portcullis's decision logs write them: one
JSON object per line (the file sink), or JSON arrays of them (the bodies the HTTP sink
posts), either gzip-compressed or not.
"""

from __future__ import annotations

import argparse
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure, emit

GZIP_MAGIC = b"\x1f\x8b"


def register(policy: Any) -> None:
    diff = policy.add_parser("diff", help="replay recorded decisions against two bundles and report what the change flips")
    diff.add_argument("old", type=Path, help="the bundle serving now (directory or .tar.gz)")
    diff.add_argument("new", type=Path, help="the bundle under review (directory or .tar.gz)")
    diff.add_argument(
        "--inputs", action="append", required=True, type=Path, metavar="FILE", help="a decision log: OPA decision-log events, JSONL or gzip (repeatable)"
    )
    diff.add_argument("--config", "-c", help="gateway configuration whose providers and PII detectors both bundles are checked against")
    diff.add_argument(
        "--fail-on",
        choices=["widen", "any"],
        help="exit 1 when such a change is found: widen (access, providers, regions, limits, PII, integrity, tools) or any",
    )
    diff.add_argument(
        "--allow-masked",
        action="store_true",
        help="let --fail-on pass decisions that could not be replayed as they happened (masked inputs, diverged decisions)",
    )
    diff.add_argument("--examples", type=int, default=3, metavar="N", help="examples kept per kind of change (default: 3)")
    diff.add_argument("--format", choices=["pretty", "json"], default="pretty")
    diff.set_defaults(run=_policy_diff)


def _policy_diff(args: argparse.Namespace) -> int:
    from portcullis.adapters.cli.offline_bundle import activated
    from portcullis.adapters.config import load_config
    from portcullis.engine.policy_diff import Replay

    if args.examples < 0:
        raise Failure("--examples must be 0 or more")
    for path in args.inputs:
        if not path.is_file():
            raise Failure(f"--inputs {path}: no such file")
    config = load_config(Path(args.config)) if args.config else None
    old = activated(args.old, config, verify_signature=False)
    new = activated(args.new, config, verify_signature=False)
    replay = Replay(old, new, args.examples)
    for path in args.inputs:
        replay.add_all(read_events(path))
    diff = replay.diff
    if diff.replayed == 0:
        files = ", ".join(map(str, args.inputs))
        raise Failure(f"no decisions to replay in {files} (of {diff.skipped} events, none of path portcullis/decision with an input)")
    caught = diff.caught(args.fail_on, args.allow_masked)
    if args.format == "json":
        text = json.dumps({**diff.as_json(), "fail_on": args.fail_on, "caught": caught}, indent=2)
    else:
        text = render(diff.as_json(), args.fail_on, caught)
    emit(text)
    return 1 if caught else 0


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Each event of a decision-log file, with the line it came from named in any error."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
    try:
        with gzip.open(path, "rb") if compressed else path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as error:
                    raise Failure(f"{path}:{number}: not JSON ({error})") from None
                except RecursionError:
                    raise Failure(f"{path}:{number}: nested deeper than a decision-log event is") from None
                for event in value if isinstance(value, list) else [value]:
                    if not isinstance(event, dict):
                        raise Failure(f"{path}:{number}: a decision-log event is a JSON object, not {type(event).__name__}")
                    yield event
    except (OSError, EOFError, zlib.error) as error:  # a truncated or damaged gzip stream
        raise Failure(f"{path}: cannot be read ({error})") from None


def render(report: dict[str, Any], fail_on: str | None, caught: list[str]) -> str:
    from portcullis.engine.policy_diff import UNCOMPARED

    inputs = report["inputs"]
    old, new = report["old"], report["new"]
    lines = [
        f"old: {old['revision'] or '(no revision)'} ({old['digest'][:12]})   new: {new['revision'] or '(no revision)'} ({new['digest'][:12]})",
        f"replayed {inputs['replayed']} decisions: {inputs['changed']} changed, {inputs['unchanged']} unchanged"
        + (f", {inputs['skipped']} events skipped" if inputs["skipped"] else "")
        + (f", {inputs['masked']} masked (replayed without the erased values)" if inputs["masked"] else ""),
        "recorded under: " + ", ".join(f"{revision} ({count})" for revision, count in sorted(inputs["recorded_revisions"].items())),
    ]
    if inputs["diverged"]:
        lines.append(
            f"warning: the old bundle decided {inputs['diverged']} of the {inputs['diverged'] + inputs['reproduced']} decisions it recorded"
            " differently on replay (masked inputs replay without the erased values): those are not compared as they happened"
        )
    elif inputs["masked"]:
        lines.append(f"warning: {inputs['masked']} inputs were masked: they replay without the erased values, not as they happened")
    for name, group in report["changes"].items():
        flag = "  [widens]" if group["widens"] else ""
        principals = ", ".join(f"{who} ({count})" for who, count in list(group["principals"].items())[:10])
        more = len(group["principals"]) - 10
        lines += ["", f"{group['title']} ({name}): {group['count']}{flag}", f"  principals: {principals}" + (f" and {more} more" if more > 0 else "")]
        for example in group["examples"]:
            lines.append(f"  - {example['decision_id']}  {example['principal']}  model {example['requested_model']}: {example['change']}")
    if not report["changes"]:
        lines += ["", "no decision changes"]
    if fail_on is not None:
        lines += ["", f"FAIL (--fail-on {fail_on}): {', '.join(caught)}" if caught else f"ok (--fail-on {fail_on}): nothing to refuse"]
        if UNCOMPARED in caught:
            lines.append("  uncompared: masked or diverged decisions were not replayed as they happened; --allow-masked accepts that")
    return "\n".join(lines)
