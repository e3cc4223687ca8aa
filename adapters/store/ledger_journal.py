"""The write-behind ledger's journal: an append-only file of its entries, one JSON line
each, numbered. An entry is in the journal before the step it records is answered — a
reservation before its request is dispatched —, so what the ledger file has not received
yet is recovered from here after a crash of the gateway (one ``write``: the operating
system has it when the call returns, as SQLite's WAL has a commit at ``synchronous=NORMAL``).

Emptied once every entry in it is in the ledger file, when it has grown past a size;
the file's ``ledger_journal.applied_seq`` says which entries are in, so entries written
again after a crash between a flush and the emptying apply nothing twice.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import orjson

EMPTY_PAST_BYTES = 4 * 1024 * 1024


class LedgerJournal:
    def __init__(self, path: Path, next_seq: int) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size
        self._next = next_seq

    def next_seq(self) -> int:
        """The number the next entry must carry (``append`` it next)."""
        return self._next

    def append(self, entry: dict[str, Any]) -> None:
        """Write ``entry`` (numbered ``next_seq()``). Raises OSError when the file cannot
        take it (its caller refuses the step). orjson: the entries hold only strings,
        64-bit integers, lists and None, which it writes as the standard library does."""
        line = orjson.dumps(entry) + b"\n"
        view = memoryview(line)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            # Cut back what a short write left: the next entry must start a line of its own.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(line)
        self._next += 1

    def empty_if_applied(self) -> None:
        """Empty the file, every entry in it being in the ledger file now, once it has
        grown past its size."""
        if self._size > EMPTY_PAST_BYTES:
            os.ftruncate(self._fd, 0)
            self._size = 0

    def close(self, empty: bool) -> None:
        if empty:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)


def entries_after(path: Path, applied_seq: int) -> list[dict[str, Any]]:
    """The journal's entries not yet applied, in order. A last line cut short (the
    gateway died inside its ``write``) was never answered: it is left out. Any other
    line that does not read is damage, and stops the start (ValueError) rather than
    lose what follows it."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    entries = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            if number == len(lines):  # no newline after it: the write it belonged to never finished
                break
            raise ValueError(f"the ledger journal {path} is damaged at line {number}; the file has every step before it") from None
        if entry["seq"] > applied_seq:
            entries.append(entry)
    return entries
