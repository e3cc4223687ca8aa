"""Stage 12: the append-only, hash-chained audit log (JSON lines).

One writer per file: the file is locked for the process's lifetime, so two gateway
processes can never interleave (and so break) one chain. Each record is one
``write`` to an ``O_APPEND`` descriptor, so a crash leaves whole records behind.
Records carry identifiers, decisions, models, usage and cost; callers must never
put prompt text, keys or personal data in them.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portcullis.engine.audit_chain import GENESIS, ChainHead, record_hash, seal


class AuditLogError(Exception):
    """The audit log cannot be opened or continued safely."""


class AuditLog:
    def __init__(self, path: Path, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise AuditLogError(f"audit log {path} is in use by another process; give each gateway process its own audit.path") from None
        self._head = _tail_head(path)

    def append(self, event: str, **fields: Any) -> None:
        record = {"event": event, "ts": self._clock().isoformat(timespec="microseconds"), **fields}
        line, digest = seal(record, self._head.seq + 1, self._head.hash)
        os.write(self._fd, line)
        self._head = ChainHead(self._head.seq + 1, digest)

    def close(self) -> None:
        os.close(self._fd)


def _tail_head(path: Path) -> ChainHead:
    """The last record's position, so a restarted gateway continues the same chain."""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return ChainHead(0, GENESIS)
        handle.seek(max(0, size - 65536))
        chunk = handle.read()
    tail = chunk.splitlines()
    if not tail or not chunk.endswith(b"\n"):
        raise AuditLogError(f"audit log {path} ends with a partial record; run `portcullis audit verify {path}`")
    try:
        record = json.loads(tail[-1])
    except ValueError:
        raise AuditLogError(f"audit log {path} ends with a damaged record; run `portcullis audit verify {path}`") from None
    if record.get("hash") != record_hash(record):
        raise AuditLogError(f"audit log {path} ends with an altered record; run `portcullis audit verify {path}`")
    return ChainHead(int(record["seq"]), record["hash"])
