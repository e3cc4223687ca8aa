"""Hash chaining for the audit log.

Each record carries ``seq`` (1, 2, 3, …), ``prev`` (the previous record's hash) and
``hash`` = SHA-256 of the record's canonical JSON without ``hash``. Altering a record
breaks its hash; removing or reordering records breaks ``seq`` and ``prev``. A chain
proves integrity relative to a trusted checkpoint only: truncating the tail needs an
external anchor to detect.

Every record ends with a newline, so bytes after the last newline are a torn write
(the process or the disk stopped mid-record), never a record: ``read_tail`` says where
the complete records end, so the writer can cut the torn bytes and record the cut.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Verification:
    records: int
    head: ChainHead
    bad_line: int | None = None
    problem: str | None = None
    repairs: tuple[int, ...] = ()  # seq of each audit_repaired record: where a torn write was cut

    @property
    def ok(self) -> bool:
        return self.bad_line is None


def verify(lines: Iterable[bytes]) -> Verification:
    """Walk the chain; stop at the first record that does not fit it."""
    head = ChainHead(0, GENESIS)
    count = 0
    repairs: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            return Verification(count, head, number, "empty line inside the log")
        try:
            record = json.loads(line)
        except ValueError:
            return Verification(count, head, number, "not a JSON record (damaged or partially written)")
        if not isinstance(record, dict):
            return Verification(count, head, number, "not a JSON object")
        if record.get("hash") != record_hash(record):
            return Verification(count, head, number, f"record seq {record.get('seq')} was altered (hash mismatch)")
        if record.get("seq") != head.seq + 1 or record.get("prev") != head.hash:
            return Verification(
                count,
                head,
                number,
                f"record seq {record.get('seq')} does not follow seq {head.seq}: a record was removed, reordered or inserted",
            )
        if not line.endswith(b"\n"):  # every record is written with its newline: this one was cut short
            return Verification(count, head, number, f"record seq {record['seq']} is not terminated: a torn write (the gateway cuts it at start-up)")
        head = ChainHead(record["seq"], record["hash"])
        count += 1
        if record.get("event") == "audit_repaired":
            repairs.append(head.seq)
    return Verification(count, head, repairs=tuple(repairs))


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
        return Tail(ChainHead(0, GENESIS), 0, torn)
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
