"""Stage 12: the append-only, hash-chained audit log (JSON lines).

One writer per file: the file is locked for the process's lifetime, so two gateway
processes can never interleave (and so break) one chain. Records carry identifiers,
decisions, models, usage and cost; callers must never put prompt text, keys or
personal data in them.

A record is in the file completely or not at all. A write the disk refuses part-way
(full, quota, file size limit, I/O error) is cut back to the last complete record at
once, and the chain head does not move. Then:

- ``append_or_raise`` (the record written before a request is dispatched) raises
  ``AuditUnavailable``: the caller refuses the request, so nothing unaudited reaches a
  provider;
- ``append`` (outcomes, refusals, budget thresholds) never raises: the record is held in
  memory, in order, and written before the next record (or by the periodic ``retry``)
  once the disk takes writes again, sealed then, so the chain stays valid. At most ``MAX_HELD`` records are held;
  beyond that they are counted and an ``audit_records_dropped`` record says how many.
  Held records are lost if the process dies before the disk recovers; the spend
  ledger, not this log, is the source of truth for money.

At start-up, bytes after the last complete record (a write torn by a crash or a full
disk) are cut, kept in a side file when the disk allows, and an ``audit_repaired``
record carrying their length and SHA-256 continues the chain.

The file rotates by size or age (``audit_files``: renamed beside it, the chain goes on
in a new file). ``fsync`` says when records are forced to the disk: ``always`` before
each append returns (a request is dispatched only once its record would survive a power
cut), ``interval`` at most ``fsync_interval`` seconds later, ``never`` when the kernel
decides (a process crash loses nothing; a power cut may). A rotated file, and the head
an anchor is about to vouch for, are always forced first.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from portcullis.adapters.audit_files import segment_path, segments, sync_directory
from portcullis.adapters.json_bytes import compact
from portcullis.engine.audit_chain import GENESIS_HEAD, ChainHead, Tail, TailError, read_tail, seal

log = logging.getLogger("portcullis.audit")

MAX_HELD = 4096  # records kept in memory while the disk refuses writes
TAIL_WINDOW = 64 * 1024  # bytes read from the end to find the last record


RETRY_ROTATION_SECONDS = 60.0  # after a rotation the disk refused: the file keeps growing until then


@dataclass(frozen=True)
class AuditWriting:
    """How the log is written (``audit.rotate``, ``audit.fsync``)."""

    rotate_bytes: int = 256 * 1024 * 1024  # 0: never by size
    rotate_seconds: float = 0  # 0: never by age
    fsync: Literal["always", "interval", "never"] = "interval"
    fsync_interval: float = 1.0


Listener = Callable[[dict[str, Any]], None]


class AuditLogError(Exception):
    """The audit log cannot be opened or continued safely."""


class AuditUnavailable(Exception):
    """A record could not be written; none of its bytes stay in the file."""


class AuditLog:
    def __init__(self, path: Path, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC), writing: AuditWriting = AuditWriting()) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._clock = clock
        self._writing = writing
        # The lock is a file of its own: the log itself is renamed when it rotates.
        self._lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock)
            raise AuditLogError(f"audit log {path} is in use by another process; give each gateway process its own audit.path") from None
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            tail = _read_tail(self._fd)
            head = tail.head if tail.complete_bytes else _rotated_head(path)  # a new file continues the last rotated one
            self._file_first_seq, self._file_started = _first_record(self._fd) if tail.complete_bytes else (None, None)
            if self._file_first_seq is not None and self._file_started is None:  # its age is unknown: counted from now
                self._file_started = self._clock().timestamp()
        except TailError as error:
            self._release()
            raise AuditLogError(f"audit log {path} {error}; run `portcullis audit verify {path}`") from None
        self._head: ChainHead = head
        self._size = tail.complete_bytes  # where the complete records end: a failed write is cut back to here
        self._held: deque[dict[str, Any]] = deque()
        self._dropped = 0
        self._failing: str | None = None  # why the last write failed, until one succeeds
        self._uncut = False  # a failed write's bytes could not be cut yet
        self._synced_seq = head.seq  # records up to here were forced to the disk (or were there at start)
        self._last_sync = time.monotonic()
        self._rotation_retry_at = 0.0
        self._listeners: list[Listener] = []
        if tail.torn:
            self._repair(tail)

    @property
    def head(self) -> ChainHead:
        """The last record written to the file."""
        return self._head

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with each record appended (before its seq and hash are added;
        held ones too). It runs on the caller's thread and must not raise or block."""
        self._listeners.append(listener)

    @property
    def available(self) -> bool:
        """False while the disk refuses writes (records are being held)."""
        return self._failing is None

    def append(self, event: str, **fields: Any) -> None:
        """Record an event; never raises. Written now, or held and written, in order,
        before the next record once the disk takes writes again."""
        record = self._record(event, fields)
        if self._flush() and self._write(record):
            self._tell(record)
            return
        if len(self._held) >= MAX_HELD:
            self._dropped += 1  # never told: what listeners derive (events) must have a record
        else:
            self._held.append(record)
            self._tell(record)  # held records are written, in order, once the disk allows

    def append_or_raise(self, event: str, **fields: Any) -> None:
        """Record an event now, after every held one, or raise ``AuditUnavailable``."""
        if not self._flush():
            raise AuditUnavailable(self._failing or "the audit log is not writable")
        record = self._record(event, fields)
        if not self._write(record):
            raise AuditUnavailable(self._failing or "the audit log is not writable")
        self._tell(record)

    def retry(self) -> bool:
        """Try the held records again (a periodic task calls this, so they land, and the
        log counts as available again, even when no request comes); True if none is left."""
        return self._flush()

    async def tick(self) -> None:
        """Called about once a second: held records tried again, a file past its age
        rotated even when nothing is written, records forced to the disk per ``fsync``."""
        if not self.available:
            self.retry()
        if self._writing.rotate_seconds and self._rotation_due():
            self._rotate()
        due = time.monotonic() - self._last_sync >= self._writing.fsync_interval
        if self._writing.fsync == "interval" and self._head.seq > self._synced_seq and due:
            await self.synced_head()

    async def synced_head(self) -> ChainHead:
        """The head, once every record up to it is on the disk: forced off the event loop,
        on a duplicate of the descriptor (a rotation may close the original meanwhile)."""
        head, descriptor = self._head, os.dup(self._fd)
        # The thread closes its own duplicate: were this await cancelled (shutdown), closing
        # it here would free the number while fdatasync still uses it.
        await asyncio.to_thread(_sync_and_close, descriptor)
        self._synced_seq, self._last_sync = max(self._synced_seq, head.seq), time.monotonic()
        return head

    def close(self) -> None:
        """Write what is held if the disk allows, force it to the disk, then release the file (once)."""
        if self._fd < 0:
            return
        if not self._flush() and (self._held or self._dropped):
            log.error("audit log %s closed with %d records unwritten (%s)", self.path, len(self._held) + self._dropped, self._failing)
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            log.error("audit log %s could not be forced to the disk on closing (%s)", self.path, error.strerror)
        self._release()

    def _release(self) -> None:
        os.close(self._fd)
        os.close(self._lock)
        self._fd = -1

    # --- writing ---------------------------------------------------------------------

    def _record(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {"event": event, "ts": self._clock().isoformat(timespec="microseconds"), **fields}

    def _tell(self, record: dict[str, Any]) -> None:
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # a listener's fault never costs a record
                log.exception("an audit listener failed on a %s record", record.get("event"))

    def _flush(self) -> bool:
        """Write every held record (and the count of dropped ones); False if the disk refused."""
        written = len(self._held)
        while self._held:
            if not self._write(self._held[0]):
                return False
            self._held.popleft()
        if self._dropped:
            if not self._write(self._record("audit_records_dropped", {"count": self._dropped, "reason": "held records exceeded while the log was unwritable"})):
                return False
            self._dropped = 0
        if written and self._failing is None:
            log.info("audit log %s: %d held records written", self.path, written)
        return True

    def _write(self, record: dict[str, Any]) -> bool:
        line, digest = seal(record, self._head.seq + 1, self._head.hash, _canonical)
        try:
            if self._uncut:  # never append after a partial record
                os.ftruncate(self._fd, self._size)
                self._uncut = False
            _write_all(self._fd, line)
            if self._writing.fsync == "always":  # a record the disk may still lose is not written
                os.fdatasync(self._fd)
        except OSError as error:
            self._cut_back()
            self._failed(error)
            return False
        self._head = ChainHead(self._head.seq + 1, digest)
        self._size += len(line)
        if self._file_first_seq is None:
            self._file_first_seq, self._file_started = self._head.seq, self._clock().timestamp()
        if self._writing.fsync == "always":
            self._synced_seq = self._head.seq
        if self._failing is not None:
            log.warning("audit log %s is writable again; accepting requests", self.path)
            self._failing = None
        if self._writing.rotate_bytes and self._size >= self._writing.rotate_bytes and time.monotonic() >= self._rotation_retry_at:
            self._rotate()
        return True

    # --- rotation --------------------------------------------------------------------

    def _rotation_due(self) -> bool:
        started = self._file_started
        aged = started is not None and self._clock().timestamp() - started >= self._writing.rotate_seconds
        return aged and time.monotonic() >= self._rotation_retry_at

    def _rotate(self) -> None:
        """Close this file of the chain under its seq range's name and continue in a new one.
        A step the disk refuses leaves the current file in place, written on, tried again later."""
        first, last = self._file_first_seq, self._head.seq
        assert first is not None
        renamed = segment_path(self.path, first, last)
        try:
            os.fdatasync(self._fd)
            os.rename(self.path, renamed)
        except OSError as error:
            return self._rotation_failed(error)
        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o640)
        except OSError as error:
            try:
                os.rename(renamed, self.path)  # the same directory, just renamed: put it back
            except OSError:  # the chain goes on in the renamed file; verify still walks it
                log.error("audit log %s: the file being rotated could not be named back from %s", self.path, renamed.name)
            return self._rotation_failed(error)
        os.close(self._fd)
        self._fd, self._size, self._file_first_seq, self._file_started = descriptor, 0, None, None
        self._synced_seq = self._head.seq
        sync_directory(self.path.parent, "audit log")
        log.info("audit log rotated: %s holds seq %d to %d", renamed.name, first, last)

    def _rotation_failed(self, error: OSError) -> None:
        self._rotation_retry_at = time.monotonic() + RETRY_ROTATION_SECONDS
        log.error("audit log %s could not rotate (%s); written on, tried again in %.0f s", self.path, error.strerror, RETRY_ROTATION_SECONDS)

    def _cut_back(self) -> None:
        """Remove what a failed write left: the file ends at the last complete record."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as error:  # tried again before the next write: nothing is appended after a partial record
            self._uncut = True
            log.error("audit log %s: a partial record could not be cut yet (%s)", self.path, error.strerror)

    def _failed(self, error: OSError) -> None:
        reason = f"{errno.errorcode.get(error.errno or 0, 'error')}: {error.strerror}"
        if self._failing is None:
            log.error("audit log %s cannot be written (%s): requests are refused with 503 audit_unavailable until it can", self.path, reason)
        self._failing = reason

    def _repair(self, tail: Tail) -> None:
        """Cut a torn write off the end and record the cut, so the chain verifies."""
        digest = hashlib.sha256(tail.torn).hexdigest()
        side = self.path.with_name(f"{self.path.name}.torn-{tail.head.seq}-{digest[:12]}")
        try:
            descriptor = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            try:
                _write_all(descriptor, tail.torn)
            finally:
                os.close(descriptor)
            kept: str | None = side.name
        except OSError as error:
            log.error("audit log %s: the torn bytes could not be kept in %s (%s); their digest is recorded", self.path, side.name, error.strerror)
            kept = None
        os.ftruncate(self._fd, tail.complete_bytes)
        log.warning("audit log %s ended with a torn write of %d bytes after seq %d; cut and recorded", self.path, len(tail.torn), tail.head.seq)
        self.append("audit_repaired", after_seq=tail.head.seq, cut_bytes=len(tail.torn), cut_sha256=digest, quarantined_to=kept)


def _canonical(record: Any) -> bytes:
    return compact(record, sort_keys=True)  # byte-equal to audit_chain.canonical, ~6x faster


def _write_all(fd: int, line: bytes) -> None:
    """One record, completely or an OSError. A short write (the disk filled up mid-record)
    is continued, so a record never ends where the disk ran out."""
    view = memoryview(line)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _sync_and_close(descriptor: int) -> None:
    try:
        os.fdatasync(descriptor)
    finally:
        os.close(descriptor)


def _rotated_head(path: Path) -> ChainHead:
    """Where the chain stands when its live file is empty: at the end of the newest rotated file."""
    rotated = segments(path)
    if not rotated:
        return GENESIS_HEAD
    descriptor = os.open(rotated[-1], os.O_RDONLY)
    try:
        return _read_tail(descriptor).head
    finally:
        os.close(descriptor)


def _first_record(fd: int) -> tuple[int | None, float | None]:
    """The seq and time (epoch seconds) of the file's first record: when a file started
    decides when it is old enough to rotate."""
    window = TAIL_WINDOW
    while (end := (chunk := os.pread(fd, window, 0)).find(b"\n")) < 0 and len(chunk) == window:
        window *= 4
    try:
        record = json.loads(chunk[:end])
        seq = int(record["seq"])
    except (ValueError, KeyError, TypeError) as error:  # the tail was intact, so this is damage: verify says where
        raise TailError("starts with a damaged record") from error
    try:
        return seq, dt.datetime.fromisoformat(record["ts"]).timestamp()
    except (ValueError, KeyError, TypeError):  # a record without a time
        return seq, None


def _read_tail(fd: int) -> Tail:
    """The last complete record and anything after it, reading back from the end."""
    size = os.fstat(fd).st_size
    window = TAIL_WINDOW
    while True:
        offset = max(0, size - window)
        chunk = os.pread(fd, size - offset, offset)
        tail = read_tail(chunk, offset)
        if tail is not None:
            return tail
        window *= 4
