"""The embedded ledger: counters, reservations and journal in one SQLite file.

Every reservation and settlement is one write inside a ``BEGIN IMMEDIATE`` transaction,
so several processes sharing the file stay exact: the file is the only authority for
the counters, and a reservation is judged on their values under the write lock. The
writes of concurrent requests of one process share a transaction (``GroupCommit``).
A write reads each table it needs once, for all its counters, and skips what cannot
change (a window slide with nothing expired, a read-before-update of the reservation).

A gateway that reserves here holds ``lock`` shared (from its first reservation on): a
gateway that keeps the ledger in memory (``sqlite_write_behind``) holds it exclusively,
and the two must not judge the same counters.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from portcullis.adapters.json_bytes import compact
from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.ledger import Final, Outcome, Reservation, Unresolved, epoch_ms, insert_reservation_sql, settle_deltas, thresholds_reached
from portcullis.adapters.store.sqlite_batch import GroupCommit
from portcullis.engine.governance import WINDOW, WINDOW_MS, Verdict, judge, window_wait_ms, windowed

_INSERT_RESERVATION = insert_reservation_sql("?")
_SETTLE = "UPDATE reservations SET state = ?, tokens = ?, cost_micro_usd = ?, usage = ?, served = ?, resolved_at = ? WHERE id = ?"
_CLEANUP_EVERY = 1000  # reservations between two sweeps of expired counters
_LOCK_TRIES, _LOCK_PAUSE_SECONDS = 20, 0.005


class SqliteLedger:
    """The ``Ledger`` on one SQLite connection (the key store's); writes go through group commit."""

    def __init__(self, connection: sqlite3.Connection, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC), lock: Path | None = None) -> None:
        self._db = connection
        self._clock = clock
        self._lock = lock
        self._lock_fd: int | None = None
        self._writes = GroupCommit(connection)
        self._since_cleanup = 0
        # Admitted and not yet settled here: when others are in flight, a write waits for
        # theirs to share its commit; alone, it commits at once.
        self._in_flight = 0

    async def reserve(self, reservation: Reservation, fail_open: bool = False) -> Verdict:
        if self._lock is not None and self._lock_fd is None:
            self._hold_lock(self._lock)
        batch = self._in_flight > 0
        verdict = await self._writes.run(partial(_reserve, reservation=reservation), batch, skip_if_abandoned=True)
        if verdict.blocked is None:
            self._in_flight += 1
        self._cleanup()
        return verdict

    async def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final) -> Outcome:
        batch = self._in_flight > 1
        try:
            # Run even if the caller is cancelled meanwhile: a settlement asked for is owed.
            return await self._writes.run(partial(_settle, reservation_id=reservation_id, charges=charges, final=final, clock=self._clock), batch)
        finally:
            self._in_flight = max(0, self._in_flight - 1)

    async def unresolved(self, older_than: dt.datetime) -> list[Unresolved]:
        return unresolved_rows(self._db, older_than)

    async def counter(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE key = ?", (key,)).fetchone()
        return row[0] if row else 0

    async def peaks(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        return dict(self._db.execute(f"SELECT key, peak FROM counters WHERE key IN ({marks(len(keys))})", keys).fetchall())

    async def values(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        return dict(self._db.execute(f"SELECT key, value FROM counters WHERE key IN ({marks(len(keys))})", keys).fetchall())

    async def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        # The connection belongs to the key store.

    def _hold_lock(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        for _ in range(_LOCK_TRIES):  # a process opening the store holds it a moment to apply a crashed gateway's journal
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(_LOCK_PAUSE_SECONDS)
                continue
            self._lock_fd = fd
            return
        os.close(fd)
        raise StoreUnavailable(
            "another gateway serves this embedded store with workers: 1 and keeps its ledger in memory; give each gateway its own store.path"
        )

    def _cleanup(self) -> None:
        self._since_cleanup += 1
        if self._since_cleanup >= _CLEANUP_EVERY:
            self._since_cleanup = 0
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM counters WHERE expires_at < ?", (self._clock().isoformat(),))
                # A window's counter expires minutes after its last entry: what is left of its log is long out of it.
                self._db.execute("DELETE FROM window_entries WHERE counter NOT IN (SELECT key FROM counters)")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")


def unresolved_rows(db: sqlite3.Connection, older_than: dt.datetime) -> list[Unresolved]:
    rows = db.execute(
        "SELECT id, request_id, state, charges, bound_tokens, bound_micro_usd, usage, served, created_at FROM reservations"
        # The first term names the partial index's rows: the planner uses it only when the query says so.
        " WHERE state IN ('open', 'pending') AND (state = 'pending' OR created_at < ?) ORDER BY created_at",
        (older_than.isoformat(),),
    ).fetchall()
    return [
        Unresolved(
            r[0],
            r[1],
            r[2],
            json.loads(r[3]),
            r[4],
            r[5],
            json.loads(r[6]) if r[6] else None,
            json.loads(r[7]) if r[7] else None,
            dt.datetime.fromisoformat(r[8]),
        )
        for r in rows
    ]


def _reserve(db: sqlite3.Connection, reservation: Reservation) -> Verdict:
    """Judge the charges on the counters' values and, if admitted, add them and record the
    reservation; a refused reservation changes nothing but the windows' slide."""
    charges = reservation.charges
    now_ms = epoch_ms(reservation.created_at)
    keys = list(dict.fromkeys(charge.key for charge in charges))
    gone = _slide(db, [charge.key for charge in charges if windowed(charge.limit.period)], now_ms)
    stored = dict(db.execute(f"SELECT key, value FROM counters WHERE key IN ({marks(len(keys))})", keys).fetchall()) if keys else {}
    current = {key: value - gone.get(key, 0) for key, value in stored.items()}
    verdict = judge(charges, current)
    if verdict.blocked is not None:
        slid = [(amount, key) for key, amount in gone.items() if key in stored]
        if slid:
            db.executemany("UPDATE counters SET value = value - ? WHERE key = ?", slid)
        blocked = verdict.blocked
        if windowed(blocked.limit.period):
            entries = db.execute("SELECT at_ms, amount FROM window_entries WHERE counter = ? ORDER BY at_ms LIMIT 1000", (blocked.key,)).fetchall()
            return replace(verdict, retry_after_ms=window_wait_ms(entries, current.get(blocked.key, 0), blocked, now_ms))
        return verdict
    if keys:
        # Under the write lock the values read above are the values: write the sums outright,
        # one statement for every counter (the slide folded in).
        totals = dict.fromkeys(keys, 0)
        expiries: dict[str, str] = {}
        for charge in charges:
            totals[charge.key] += charge.amount
            expiries[charge.key] = max(expiries.get(charge.key, ""), charge.expires_at.isoformat())
        rows = [(key, current.get(key, 0) + totals[key], expiries[key]) for key in keys]
        db.execute(
            f"INSERT INTO counters (key, value, expires_at, peak) VALUES {_rows(len(rows), 4)}"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = max(expires_at, excluded.expires_at), peak = max(peak, excluded.value)",
            [value for key, total, expiry in rows for value in (key, total, expiry, total)],
        )
        entries = [(charge.key, reservation.id, now_ms, charge.amount) for charge in charges if windowed(charge.limit.period)]
        if entries:
            db.executemany("INSERT INTO window_entries VALUES (?, ?, ?, ?)", entries)
    *values, created_at = reservation.open_row()
    db.execute(_INSERT_RESERVATION, (*values, created_at.isoformat()))
    return verdict


def _slide(db: sqlite3.Connection, windows: list[str], now_ms: int) -> dict[str, int]:
    """Drop the entries that have left their window; what each window lost, to take off
    its total. Read first: most of the time nothing has left, and a read is cheap."""
    if not windows:
        return {}
    where = f"counter IN ({marks(len(windows))}) AND at_ms <= ?"
    arguments = (*windows, now_ms - WINDOW_MS)
    gone: dict[str, int] = {}
    for key, amount in db.execute(f"SELECT counter, amount FROM window_entries WHERE {where}", arguments).fetchall():
        gone[key] = gone.get(key, 0) + amount
    if gone:
        db.execute(f"DELETE FROM window_entries WHERE {where}", arguments)
    return gone


def _settle(db: sqlite3.Connection, reservation_id: str, charges: list[dict[str, Any]], final: Final, clock: Callable[[], dt.datetime]) -> Outcome:
    """Replace the reservation's charges with the final amounts, once: a reservation no
    longer in a state this settlement may leave is a replay and changes nothing."""
    now = clock().isoformat()
    record = (final.state, final.tokens, final.cost_micro_usd, json_text(final.usage), json_text(final.served), now, reservation_id)
    if final.state == "reconciled":
        row = db.execute("SELECT state, created_at FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
        if row is None or row[0] not in ("open", "pending"):
            return Outcome(row[0] if row else "unknown", replayed=True)
        previous, created_at = row
        db.execute(_SETTLE, record)
    else:
        # Only an open reservation settles; the state read again only for a replay's answer.
        settled = db.execute(f"{_SETTLE} AND state = 'open' RETURNING created_at", record).fetchall()
        if not settled:
            row = db.execute("SELECT state FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
            return Outcome(row[0] if row else "unknown", replayed=True)
        previous, [(created_at,)] = "open", settled
    # A window's entries are keyed by the time the reservation was made, as _reserve wrote them.
    reserved_ms = epoch_ms(dt.datetime.fromisoformat(created_at))
    moving = _window_moves(db, reservation_id, reserved_ms, settle_deltas(charges, final.amounts))
    after: dict[str, int] = {}
    if moving:
        db.executemany(
            "UPDATE counters SET value = value + ?, peak = max(peak, value + ?) WHERE key = ?", [(delta, delta, key) for key, delta in moving.items()]
        )
        keys = list(moving)
        after = dict(db.execute(f"SELECT key, value FROM counters WHERE key IN ({marks(len(keys))})", keys).fetchall())
    crossings = _fire_thresholds(db, charges, [(key, after[key]) for key in moving if key in after], now)  # a missing counter: its period is long over
    if final.state == "reconciled":
        db.execute(
            "INSERT INTO reconciliations (reservation_id, resolution, tokens, cost_micro_usd, note, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (reservation_id, previous, final.tokens, final.cost_micro_usd, final.note, now),
        )
    return Outcome(final.state, thresholds=crossings)


def _window_moves(db: sqlite3.Connection, reservation_id: str, reserved_ms: int, deltas: dict[str, int]) -> dict[str, int]:
    """The deltas that move their counter: a window's total moves only while the entry is still in it."""
    windows = [key for key in deltas if key.endswith(f"|{WINDOW}")]
    if not windows:
        return deltas
    moved = db.executemany(
        "UPDATE window_entries SET amount = amount + ? WHERE counter = ? AND at_ms = ? AND reservation_id = ?",
        [(deltas[key], key, reserved_ms, reservation_id) for key in windows],
    )
    if moved.rowcount != len(windows):  # some entry has left its window: which ones are still in
        kept = {
            key
            for (key,) in db.execute(
                f"SELECT counter FROM window_entries WHERE at_ms = ? AND reservation_id = ? AND counter IN ({marks(len(windows))})",
                (reserved_ms, reservation_id, *windows),
            )
        }
        return {key: delta for key, delta in deltas.items() if key not in windows or key in kept}
    return deltas


def _fire_thresholds(db: sqlite3.Connection, charges: list[dict[str, Any]], values: list[tuple[str, int]], now: str) -> tuple[tuple[str, int], ...]:
    """Record each budget threshold the counters' values reached, once per counter instance;
    the ones recorded now (for the first time) are the crossings to report."""
    reached = thresholds_reached(charges, values)
    if not reached:
        return ()
    keys = list(dict.fromkeys(key for key, _ in reached))
    fired = set(db.execute(f"SELECT counter, threshold FROM threshold_events WHERE counter IN ({marks(len(keys))})", keys).fetchall())
    crossings = tuple(item for item in reached if item not in fired)
    if crossings:
        db.executemany("INSERT INTO threshold_events (counter, threshold, fired_at) VALUES (?, ?, ?)", [(key, threshold, now) for key, threshold in crossings])
    return crossings


def marks(count: int) -> str:
    """``count`` SQLite placeholders, for an ``IN (…)`` list."""
    return ",".join("?" * count)


def _rows(count: int, width: int) -> str:
    row = f"({marks(width)})"
    return ",".join([row] * count)


def json_text(value: Any) -> str | None:
    return compact(value).decode() if value is not None else None
