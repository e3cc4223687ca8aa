"""``portcullis audit verify --anchors``: each chain walked, then held against the
anchors its gateway wrote elsewhere. The chain alone cannot tell a log cut short, or a
tail rewritten and re-sealed, from an intact one; an anchor that the log no longer
reaches, or whose record now has another hash, can."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from portcullis.adapters.anchors.base import AnchorReading, AnchorSinkError, AnchorSource
from portcullis.adapters.cli.audit import walk_chain
from portcullis.adapters.cli.common import Failure
from portcullis.engine.audit_anchors import compare

SHOWN_DAMAGED = 20  # damaged entries listed one by one; the rest are counted
WORKER_CHAIN = re.compile(r"(?P<base>.+)\.w\d+")


def verify_with_anchors(paths: Sequence[tuple[Path, int]], source_text: str, chain: str | None, endpoint_url: str | None) -> int:
    """``paths``: each chain's live file and its worker index (0: the first process)."""
    from portcullis.adapters.anchors.sinks import open_anchor_source

    try:
        source = open_anchor_source(source_text, endpoint_url)
        chains = source.chains()
    except AnchorSinkError as error:
        raise Failure(str(error)) from None
    base = chain or _default_chain(source, chains)
    status = 0
    for path, index in paths:
        name = base if index == 0 else f"{base}.w{index}"  # as AnchorConfig.for_worker names it
        status = max(status, _verify_chain(path, name, source, chains))
    return status


def _default_chain(source: AnchorSource, chains: list[str]) -> str:
    if not chains:
        raise Failure(f"{source.name} holds no anchors")
    # Workers' chains (<name>.w<k>) go with their first process's: one gateway is one choice.
    bases = [name for name in chains if not ((match := WORKER_CHAIN.fullmatch(name)) and match["base"] in chains)]
    if len(bases) == 1:
        return bases[0]
    raise Failure(f"{source.name} holds the anchors of several chains; name one with --chain: {', '.join(chains)}")


def _verify_chain(path: Path, name: str, source: AnchorSource, chains: list[str]) -> int:
    try:
        reading = source.read(name)
    except AnchorSinkError as error:
        raise Failure(str(error)) from None
    walk = walk_chain(path, {anchor.seq for anchor in reading.anchors})
    if not reading.anchors and not reading.damaged:
        found = f" (it holds: {', '.join(chains)})" if chains else ""
        print(f"{path}: {source.name} holds no anchors of chain {name}{found}: nothing vouches for this log")
        return 1
    if not walk.ok:
        print(f"{path}: not compared with its anchors: the chain itself is broken (above)")
        return 1
    report = compare(reading.anchors, walk.found, walk.first_seq, walk.head.seq)
    earlier = f"; {report.earlier} are of records in files no longer here" if report.earlier else ""
    print(f"{path}: {len(reading.anchors)} anchors of chain {name} in {source.name}, {report.checked} checked against the log{earlier}")
    if report.latest is not None:
        after = f"{report.unanchored} records after it are vouched for by the chain alone" if report.latest.seq <= walk.head.seq else "the log ends before it"
        print(f"latest anchor: seq {report.latest.seq} at {report.latest.ts}; {after}")
    if reading.hidden:
        print(f"note: {reading.hidden} anchors were behind a delete marker (read all the same; the gateway never deletes anchors)")
    problems = [*report.problems, *_damaged(reading)]
    for problem in problems:
        print(f"problem: {problem}")
    if problems:
        return 1
    print(f"{path}: the log agrees with its anchors")
    return 0


def _damaged(reading: AnchorReading) -> list[str]:
    shown = [f"damaged anchor: {why}" for why in reading.damaged[:SHOWN_DAMAGED]]
    if len(reading.damaged) > SHOWN_DAMAGED:
        shown.append(f"damaged anchor: {len(reading.damaged) - SHOWN_DAMAGED} more not shown")
    return shown
