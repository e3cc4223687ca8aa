"""Hash chaining for the audit log.

Each record carries ``seq`` (1, 2, 3, …), ``prev`` (the previous record's hash) and
``hash`` = SHA-256 of the record's canonical JSON without ``hash``. Altering a record
breaks its hash; removing or reordering records breaks ``seq`` and ``prev``. A chain
proves integrity relative to a trusted checkpoint only: truncating the tail needs an
external anchor to detect (``audit_anchors``). A rotated log is one chain over several
files: each file's first record follows the previous file's last.

Every record ends with a newline, so bytes after the last newline are a torn write
(the process or the disk stopped mid-record), never a record: ``read_tail`` says where
the complete records end, so the writer can cut the torn bytes and record the cut.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GENESIS = "0" * 64


def canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(record: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


def seal(record: Mapping[str, Any], seq: int, prev: str, encode: Callable[[Mapping[str, Any]], bytes] = canonical) -> tuple[bytes, str]:
    """``record`` linked after the record whose hash is ``prev``: its JSON line (with
    ``hash`` appended; key order does not matter to verification) and its hash.
    ``encode`` must write exactly the bytes ``canonical`` writes (a faster encoder may)."""
    body = encode({**record, "seq": seq, "prev": prev})
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"hash":"' + digest.encode() + b'"}\n', digest


@dataclass(frozen=True)
class ChainHead:
    seq: int
    hash: str


GENESIS_HEAD = ChainHead(0, GENESIS)


@dataclass(frozen=True)
class Verification:
    records: int
    head: ChainHead
    bad_line: int | None = None
    problem: str | None = None
    repairs: tuple[int, ...] = ()  # seq of each audit_repaired record: where a torn write was cut
    first_seq: int | None = None  # the first record's seq (None: no record)
    found: Mapping[int, str] = field(default_factory=dict)  # hash of each record whose seq was asked for

    @property
    def ok(self) -> bool:
        return self.bad_line is None


def verify(lines: Iterable[bytes], start: ChainHead | None = GENESIS_HEAD, wanted: Collection[int] = ()) -> Verification:
    """Walk the chain; stop at the first record that does not fit it. ``start``: the head
    the first record must follow (the previous file's, once a log has rotated); None takes
    the first record as given (the files before it are no longer here: only an anchor
    can vouch for it). ``wanted``: the seqs whose hashes are returned in ``found``."""
    head = start or GENESIS_HEAD
    count = 0
    repairs: list[int] = []
    found: dict[int, str] = {}
    first: int | None = None

    def broken(number: int, problem: str) -> Verification:  # where the walk stopped, and why
        return Verification(count, head, number, problem, tuple(repairs), first, found)

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            return broken(number, "empty line inside the log")
        try:
            record = json.loads(line)
        except ValueError:
            return broken(number, "not a JSON record (damaged or partially written)")
        if not isinstance(record, dict):
            return broken(number, "not a JSON object")
        if record.get("hash") != record_hash(record):
            return broken(number, f"record seq {record.get('seq')} was altered (hash mismatch)")
        follows = record.get("seq") == head.seq + 1 and record.get("prev") == head.hash
        if not follows and not (start is None and count == 0 and isinstance(record.get("seq"), int)):
            problem = f"record seq {record.get('seq')} does not follow seq {head.seq}: a record was removed, reordered or inserted"
            return broken(number, problem)
        if not line.endswith(b"\n"):  # every record is written with its newline: this one was cut short
            problem = f"record seq {record['seq']} is not terminated: a torn write (the gateway cuts it at start-up)"
            return broken(number, problem)
        head = ChainHead(record["seq"], record["hash"])
        first = head.seq if first is None else first
        count += 1
        if head.seq in wanted:
            found[head.seq] = head.hash
        if record.get("event") == "audit_repaired":
            repairs.append(head.seq)
    return Verification(count, head, repairs=tuple(repairs), first_seq=first, found=found)


@dataclass(frozen=True)
class Tail:
    """The end of a log: the last complete record's position, the byte offset where the
    complete records end, and what follows them (a torn write; empty when none)."""

    head: ChainHead
    complete_bytes: int
    torn: bytes


class TailError(Exception):
    """The last complete line of the log is not an intact record: damage, not a torn write."""


def read_tail(chunk: bytes, chunk_offset: int) -> Tail | None:
    """The tail of a log whose last ``len(chunk)`` bytes start at ``chunk_offset``; None
    when the chunk holds no complete record boundary and more of the file is needed."""
    cut = chunk.rfind(b"\n") + 1  # 0: no newline in the chunk
    torn = chunk[cut:]
    if cut == 0:
        if chunk_offset > 0:
            return None
        return Tail(GENESIS_HEAD, 0, torn)
    start = chunk.rfind(b"\n", 0, cut - 1) + 1
    if start == 0 and chunk_offset > 0:
        return None
    try:
        record = json.loads(chunk[start:cut])
    except ValueError:
        raise TailError("ends with a damaged record") from None
    if not isinstance(record, dict) or record.get("hash") != record_hash(record) or not isinstance(record.get("seq"), int):
        raise TailError("ends with an altered record")
    return Tail(ChainHead(record["seq"], record["hash"]), chunk_offset + cut, torn)
