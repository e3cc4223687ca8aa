"""The file sink: one JSON line per anchor, appended and forced to the disk before the
write counts. It proves something only where the gateway cannot rewrite the file: on
another mount, or made append-only (``chattr +a``) by someone else. Opening one on the
log's own device is allowed (a start on one disk) but warned about."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from pathlib import Path

from portcullis.adapters.anchors.base import AnchorReading, AnchorSinkError, anchor_body
from portcullis.adapters.audit_config import FileSinkConfig
from portcullis.adapters.audit_files import sync_directory
from portcullis.engine.audit_anchors import Anchor, AnchorFormatError, parse_anchor

log = logging.getLogger("portcullis.anchors")


class FileSink:
    def __init__(self, path: Path, descriptor: int) -> None:
        self.name = f"file:{path}"
        self.path = path
        self._fd = descriptor
        self._lock = asyncio.Lock()
        self._torn = False  # a write failed part-way: the next one starts on a line of its own

    @classmethod
    def open(cls, config: FileSinkConfig, audit_directory: Path | None = None) -> FileSink:
        """Open (creating, mode 0600) the sink's file; warn when it shares a device with
        ``audit_directory``, since one disk's owner could then rewrite both."""
        path = config.path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            created = not path.exists()
            descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise AnchorSinkError(f"anchor sink file:{path}: cannot open it ({error.strerror})") from None
        if created:
            sync_directory(path.parent, "anchor sink")  # the new file's name survives a power cut too
        sink = cls(path, descriptor)
        if audit_directory is not None:
            try:
                same = os.fstat(descriptor).st_dev == os.stat(audit_directory).st_dev
            except OSError:
                same = False
            if same:
                log.warning(
                    "anchor sink %s is on the same device as the audit log (%s): whoever can rewrite the log there can rewrite its anchors; "
                    "put it on another mount or make it append-only",
                    sink.name,
                    audit_directory,
                )
        return sink

    async def write(self, anchor: Anchor) -> None:
        line = anchor_body(anchor) + b"\n"
        async with self._lock:
            if self._fd < 0:
                raise AnchorSinkError(f"{self.name}: closed")
            if self._torn:  # an empty line to the reader; the fragment before it is reported, not merged
                line = b"\n" + line
            try:
                # On a duplicate: a write cancelled at shutdown runs on in its thread, and
                # close() must not free the descriptor number under it for another file.
                await asyncio.to_thread(_append, os.dup(self._fd), line)
            except OSError as error:
                self._torn = True
                raise AnchorSinkError(f"{self.name}: {error.strerror}") from None
            self._torn = False

    async def close(self) -> None:
        async with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _append(descriptor: int, line: bytes) -> None:
    """Write ``line`` and force it to the disk, then close ``descriptor`` (a duplicate)."""
    try:
        view = memoryview(line)
        while view:  # a short write (the disk filling up) is continued, never left half a line
            written = os.write(descriptor, view)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class FileAnchorSource:
    """A file sink's file read back: each line an anchor, or a damaged entry reported by line number."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise AnchorSinkError(f"cannot read the anchors in {path}: {error.strerror}") from None
        self._anchors: list[Anchor] = []
        self._damaged: list[tuple[str | None, str]] = []  # (its chain when it says one, why)
        for number, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():  # a failed write's next line starts with a newline of its own
                continue
            try:
                record = json.loads(line)
            except ValueError:
                self._damaged.append((None, f"{path} line {number}: not JSON (damaged, or a write cut short)"))
                continue
            try:
                self._anchors.append(parse_anchor(record))
            except AnchorFormatError as error:
                chain = record.get("chain") if isinstance(record, dict) and isinstance(record.get("chain"), str) else None
                self._damaged.append((chain, f"{path} line {number}: {error}"))

    def chains(self) -> list[str]:
        return sorted({anchor.chain for anchor in self._anchors} | {chain for chain, _ in self._damaged if chain})

    def read(self, chain: str) -> AnchorReading:
        # A damaged line that names no chain may have been any chain's: each is told of it.
        return AnchorReading(
            chain,
            tuple(anchor for anchor in self._anchors if anchor.chain == chain),
            tuple(why for named, why in self._damaged if named in (None, chain)),
        )
