"""Anchors: the audit chain's head (seq, hash, time) kept where the gateway cannot
rewrite it. The chain alone proves that records between its ends are unaltered; an
anchor also proves that the records up to its seq existed with exactly those hashes at
its time. So a log that ends before the last anchor was truncated, and a record whose
hash differs from an anchor's was rewritten, with every record after it. Records after
the last anchor are vouched for by the chain only: how often the head is anchored bounds
what an attacker who holds the gateway's disk could remove or rewrite unseen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Anchor:
    seq: int
    hash: str
    ts: str  # when the head was anchored (ISO 8601, UTC)
    chain: str  # which chain: each gateway process writes its own

    def as_record(self) -> dict[str, Any]:
        return {"chain": self.chain, "seq": self.seq, "hash": self.hash, "ts": self.ts}


class AnchorFormatError(ValueError):
    """An anchor record that is not one (what a sink handed back was damaged)."""


def parse_anchor(record: Any) -> Anchor:
    if not isinstance(record, Mapping):
        raise AnchorFormatError("not a JSON object")
    seq, digest, ts, chain = record.get("seq"), record.get("hash"), record.get("ts"), record.get("chain")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise AnchorFormatError("seq is not a positive integer")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise AnchorFormatError("hash is not a SHA-256 hex digest")
    if not isinstance(ts, str) or not isinstance(chain, str) or not chain:
        raise AnchorFormatError("ts or chain is missing")
    return Anchor(seq, digest, ts, chain)


@dataclass(frozen=True)
class AnchorReport:
    checked: int  # anchors compared with a record of the log
    earlier: int  # anchors of records in files no longer here (rotated away): not checkable
    latest: Anchor | None  # the newest anchor (by seq)
    problems: tuple[str, ...]
    unanchored: int  # records after the latest anchor: the chain's word only

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(anchors: Iterable[Anchor], found: Mapping[int, str], first_seq: int | None, head_seq: int) -> AnchorReport:
    """Hold a verified log (the hashes ``found`` of the anchored seqs, its first and last
    seq) against its anchors. The earliest disagreement is the one that matters: every
    record after a rewritten one is suspect, so problems are listed in seq order."""
    ordered = sorted(set(anchors))
    problems: list[str] = []
    checked = earlier = 0
    for anchor in ordered:
        if anchor.seq > head_seq:
            problems.append(
                f"truncated: the log ends at seq {head_seq}, but seq {anchor.seq} was anchored at {anchor.ts} "
                f"({anchor.seq - head_seq} or more records are missing from its end)"
            )
            break  # every later anchor says the same
        if first_seq is None or anchor.seq < first_seq:
            earlier += 1
            continue
        checked += 1
        if found.get(anchor.seq) != anchor.hash:
            problems.append(f"rewritten: record seq {anchor.seq} is not the one anchored at {anchor.ts} (hash {anchor.hash[:16]}…)")
    latest = ordered[-1] if ordered else None
    unanchored = head_seq - latest.seq if latest is not None and latest.seq <= head_seq else head_seq if latest is None else 0
    return AnchorReport(checked, earlier, latest, tuple(problems), unanchored)
