"""The embedded ledger of a gateway that is its file's only judge (``workers: 1``):
decided in memory (``ledger_memory``), made durable by one journal ``write`` per step
(``ledger_journal``), and written to the SQLite file behind the requests, many steps
per transaction.

Why: written through, every reservation and settlement is a transaction of its own on
the event loop (~0.5 ms per request in a loaded gateway). Here a step is a few dozen
microseconds of Python and a ``write``; the file gets every row the write-through ledger
writes (the spend journal's triggers included): before a settled answer leaves when no
other request is in flight (a client that waits for its answer finds the file current),
else every ``FLUSH_SECONDS``, many requests in one transaction. The flush runs on the
event loop: on a thread of its own it handed the GIL back and forth with the loop at
every statement, and measured slower than writing through.

Who may write the file meanwhile: the CLI's ``ledger reconcile``, or an operator's SQL.
Any commit of another connection moves SQLite's ``data_version``; a read or reservation
here sees it (within ``FOLLOW_SECONDS``), flushes, and reads the counters again; the
file takes changes by amounts, so neither side's is lost. Not a second gateway: this
one holds ``<path>.ledger-lock`` exclusively, and a write-through gateway holds it
shared before it reserves (``sqlite_ledger``), so the two exclude each other: a gateway
that finds the lock taken writes through, and its reservations are refused (503) while
the other serves.

After a crash, the first process to open the store with the lock free (a gateway of
either kind, or a CLI command) applies the journal's entries the file lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.ledger import Final, Outcome, Reservation, Unresolved, insert_reservation_sql
from portcullis.adapters.store.ledger_journal import LedgerJournal, entries_after
from portcullis.adapters.store.ledger_memory import Entry, LedgerMemory
from portcullis.adapters.store.sqlite_ledger import SqliteLedger, unresolved_rows
from portcullis.engine.governance import Verdict

log = logging.getLogger("portcullis.ledger")

_INSERT_RESERVATION = insert_reservation_sql("?")
FLUSH_SECONDS = 0.02  # while requests are in flight: how long the file may lag behind
_RETRY_SECONDS = 0.5  # after a flush that failed (the file busy or full): the entries wait in memory and the journal
FOLLOW_SECONDS = 0.001  # how stale another writer's change may be here: one look per millisecond, not two per request
_EXPIRE_EVERY = 1000  # reservations between two sweeps of expired counters, as the write-through ledger


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".ledger-lock")


def journal_path(path: Path) -> Path:
    return path.with_name(path.name + ".ledger-journal")


def open_embedded_ledger(connection: sqlite3.Connection, path: Path, write_behind: bool) -> WriteBehindLedger | SqliteLedger:
    """The embedded store's ledger: with ``write_behind`` and the file's ledger free,
    kept in memory; otherwise written through (where a gateway writing behind holds the
    lock, a reservation is refused). Whoever finds the ledger free first applies a
    journal a crashed gateway left, whatever it opens next."""
    if write_behind:
        behind = WriteBehindLedger.open(connection, path)
        if behind is not None:
            return behind
    else:
        lock_fd = _claim(connection, path)
        if lock_fd is not None:
            os.close(lock_fd)
    return SqliteLedger(connection, lock=lock_path(path))


def _claim(connection: sqlite3.Connection, path: Path) -> int | None:
    """The file's ledger lock, held exclusively, once a journal a crashed gateway left is
    in the file; None when a gateway serves the file (its journal is its own)."""
    lock_fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return None
    try:
        recover(connection, journal_path(path))
    except BaseException:
        os.close(lock_fd)
        raise
    return lock_fd


class WriteBehindLedger:
    """The ``Ledger`` kept in memory: ``open`` it (None when another process holds the
    file's ledger), or ``open_embedded_ledger``."""

    def __init__(self, connection: sqlite3.Connection, path: Path, lock_fd: int, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._db = connection  # the key store's
        self._clock = clock
        self._lock_fd = lock_fd
        self._memory = LedgerMemory(connection)
        self._version = _data_version(connection)
        self._followed_at = 0.0
        self._journal = LedgerJournal(journal_path(path), _applied(connection) + 1)
        self._waiting: list[Entry] = []
        self._flush_at: asyncio.Handle | None = None
        self._in_flight = 0  # admitted, not yet settled
        self._since_expiry = 0
        self.flushes = 0  # transactions written, and the steps they carried: for tests and benchmarks
        self.flushed = 0

    @classmethod
    def open(cls, connection: sqlite3.Connection, path: Path, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> WriteBehindLedger | None:
        lock_fd = _claim(connection, path)
        if lock_fd is None:
            return None
        try:
            return cls(connection, path, lock_fd, clock)
        except BaseException:
            os.close(lock_fd)
            raise

    async def reserve(self, reservation: Reservation, fail_open: bool = False) -> Verdict:
        self._follow_other_writers()
        verdict, entry = self._memory.reserve(reservation, self._journal.next_seq())
        if entry is not None:
            self._record(entry)
        if verdict.blocked is None:
            self._in_flight += 1
        self._since_expiry += 1  # every reservation, as the write-through ledger counts them
        if self._since_expiry >= _EXPIRE_EVERY:
            self._expire()
        return verdict

    async def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final) -> Outcome:
        self._in_flight = max(0, self._in_flight - 1)
        self._follow_other_writers()  # a reconcile elsewhere may have taken this reservation over
        outcome, entry = self._memory.settle(reservation_id, charges, final, self._clock().isoformat(), self._journal.next_seq())
        if entry is not None:
            self._record(entry)
        if not self._in_flight:
            self._flush_quietly()
        return outcome

    async def unresolved(self, older_than: dt.datetime) -> list[Unresolved]:
        self.flush()
        return unresolved_rows(self._db, older_than)

    async def counter(self, key: str) -> int:
        self._follow_other_writers()
        return self._memory.values([key]).get(key, [0])[0]

    async def peaks(self, keys: list[str]) -> dict[str, int]:
        self._follow_other_writers()
        return {key: counter[2] for key, counter in self._memory.values(keys).items()}

    async def values(self, keys: list[str]) -> dict[str, int]:
        self._follow_other_writers()
        return {key: counter[0] for key, counter in self._memory.values(keys).items()}

    async def close(self) -> None:
        try:
            self.flush()
        except StoreUnavailable:
            log.error("the embedded ledger stopped with %d steps not in its file yet; its journal keeps them for the next start", len(self._waiting))
        if self._flush_at is not None:  # a retry the failed flush scheduled
            self._flush_at.cancel()
            self._flush_at = None
        self._journal.close(empty=not self._waiting)
        os.close(self._lock_fd)  # releases the lock

    def flush(self) -> None:
        """Write every waiting entry to the file now, in one transaction; StoreUnavailable
        when the file cannot take them (they stay waiting, and journaled)."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        if not self._waiting:
            return
        batch, db = self._waiting, self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            kept = apply_entries(db, batch)
            db.execute("UPDATE ledger_journal SET applied_seq = ?", (batch[-1]["seq"],))
            db.execute("COMMIT")
        except sqlite3.Error as error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            log.warning("the embedded ledger could not write %d steps to its file (%s); they wait in its journal", len(batch), error)
            self._version = -1  # until they are in, every step first tries again (and fails closed)
            self._retry()
            raise StoreUnavailable("the ledger file cannot be written") from None
        self._waiting = []
        self.flushes += 1
        self.flushed += len(batch)
        if kept:
            self._memory.forget_flushed(batch[-1]["seq"])
        else:
            self._version = -1  # a settlement the file refused (another writer moved it): read the file again
        self._journal.empty_if_applied()

    def _record(self, entry: Entry) -> None:
        """Journal the entry and queue it for the file. A journal that cannot be written
        fails the step closed; what memory decided for it is taken back by reading the
        file again once the entries before it are in."""
        try:
            self._journal.append(entry)
        except OSError as error:
            self._version = -1
            raise StoreUnavailable(f"the ledger journal cannot be written: {error.strerror or type(error).__name__}") from None
        self._waiting.append(entry)
        self._schedule()

    def _schedule(self) -> None:
        if self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self._on_timer)

    def _on_timer(self) -> None:
        self._flush_at = None
        self._flush_quietly()

    def _flush_quietly(self) -> None:
        with contextlib.suppress(StoreUnavailable):  # said in the log; retried by its timer
            self.flush()

    def _retry(self) -> None:
        try:
            self._flush_at = asyncio.get_running_loop().call_later(_RETRY_SECONDS, self._on_timer)
        except RuntimeError:
            self._flush_at = None  # no loop (closing): the journal keeps them

    def _expire(self) -> None:
        """Sweep expired counters out of memory and the file together: the sweep's entry
        is flushed at once, and memory forgets only once the file has it (else memory
        would read the swept rows again). Not now if the journal or the file cannot
        take it: the next reservation tries again."""
        now = self._clock().isoformat()
        try:
            self._record(self._memory.expiry(now, self._journal.next_seq()))
            self.flush()
        except StoreUnavailable:
            return
        self._since_expiry = 0
        self._memory.forget_expired(now)

    def _follow_other_writers(self) -> None:
        """Another connection changed the file (its data_version moved: this connection's
        own flushes do not move it), or memory lost track of the file: flush, then read
        the counters again."""
        now = time.monotonic()
        if now - self._followed_at < FOLLOW_SECONDS and self._version >= 0:
            return
        self._followed_at = now
        version = _data_version(self._db)
        if version != self._version:
            self.flush()
            self._memory.clear()
            self._version = version


def recover(db: sqlite3.Connection, journal: Path) -> int:
    """Apply the journal's entries the file lacks (the gateway stopped before flushing
    them), in one transaction, then empty it; how many. Only with the lock held
    exclusively: a running gateway's journal is its own."""
    applied = _applied(db)
    entries = entries_after(journal, applied)
    if entries:
        db.execute("BEGIN IMMEDIATE")
        try:
            apply_entries(db, entries)
            db.execute("UPDATE ledger_journal SET applied_seq = ?", (entries[-1]["seq"],))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        log.warning("the embedded ledger recovered %d journaled steps its file did not have yet", len(entries))
    if journal.exists():
        os.truncate(journal, 0)  # all in the file: what comes next starts a clean journal
    return len(entries)


def apply_entries(db: sqlite3.Connection, entries: list[Entry]) -> bool:
    """Change the file by ``entries``, in order, inside the caller's transaction. False
    when a settlement found its reservation moved on (another writer's): skipped whole.
    A counter's moves are summed and written once (its peak from the highest running
    sum), before a sweep of expired counters and at the end."""
    kept = True
    counters = _CounterMoves()
    for entry in entries:
        op = entry["op"]
        if op == "settle":
            if _apply_settle(db, entry):
                counters.add(entry["counters"], insert=False)
            else:
                kept = False
            continue
        if op == "expire":
            counters.write(db)
            db.execute("DELETE FROM counters WHERE expires_at < ?", (entry["before"],))
            db.execute("DELETE FROM window_entries WHERE counter NOT IN (SELECT key FROM counters)")
            continue
        if entry["slides"]:
            db.executemany("DELETE FROM window_entries WHERE counter = ? AND at_ms <= ?", entry["slides"])
        if op == "slide":
            counters.add(entry["counters"], insert=False)
            continue
        counters.add(entry["counters"], insert=True)
        if entry["windows"]:
            db.executemany("INSERT INTO window_entries (counter, reservation_id, at_ms, amount) VALUES (?, ?, ?, ?)", entry["windows"])
        db.execute(_INSERT_RESERVATION, entry["row"])
    counters.write(db)
    return kept


class _CounterMoves:
    """Each counter's moves in a batch: their sum, the highest running sum (what raises
    the peak) and, for a reservation's, the expiry (a reservation may create the row)."""

    def __init__(self) -> None:
        self._moves: dict[str, list[Any]] = {}  # key -> [sum, highest running sum, expiry or None]

    def add(self, moves: list[list[Any]], insert: bool) -> None:
        for key, delta, *expiry in moves:
            move = self._moves.setdefault(key, [0, 0, None])
            move[0] += delta
            move[1] = max(move[1], move[0])
            if insert:
                move[2] = max(move[2] or "", expiry[0])

    def write(self, db: sqlite3.Connection) -> None:
        if not self._moves:
            return
        created = [(key, total, expiry, highest) for key, (total, highest, expiry) in self._moves.items() if expiry is not None]
        moved = [(highest, total, key) for key, (total, highest, expiry) in self._moves.items() if expiry is None]
        if created:
            db.executemany(
                "INSERT INTO counters (key, value, expires_at, peak) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET"
                " peak = max(peak, value + excluded.peak), value = value + excluded.value, expires_at = max(expires_at, excluded.expires_at)",
                created,
            )
        if moved:
            db.executemany("UPDATE counters SET peak = max(peak, value + ?), value = value + ? WHERE key = ?", moved)
        self._moves.clear()


def _apply_settle(db: sqlite3.Connection, entry: Entry) -> bool:
    states = entry["from"]
    moved = db.execute(
        "UPDATE reservations SET state = ?, tokens = ?, cost_micro_usd = ?, usage = ?, served = ?, resolved_at = ?"
        f" WHERE id = ? AND state IN ({','.join('?' * len(states))})",
        (*entry["final"], entry["id"], *states),
    ).rowcount
    if not moved:
        return False
    if entry["windows"]:
        db.executemany(
            "UPDATE window_entries SET amount = amount + ? WHERE counter = ? AND at_ms = ? AND reservation_id = ?",
            [(delta, key, at_ms, rid) for key, at_ms, rid, delta in entry["windows"]],
        )
    if entry["thresholds"]:
        db.executemany("INSERT OR IGNORE INTO threshold_events (counter, threshold, fired_at) VALUES (?, ?, ?)", entry["thresholds"])
    if entry["reconciliation"] is not None:
        db.execute(
            "INSERT INTO reconciliations (reservation_id, resolution, tokens, cost_micro_usd, note, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (entry["id"], *entry["reconciliation"]),
        )
    return True


def _data_version(db: sqlite3.Connection) -> int:
    return db.execute("PRAGMA data_version").fetchone()[0]


def _applied(db: sqlite3.Connection) -> int:
    return db.execute("SELECT applied_seq FROM ledger_journal").fetchone()[0]
