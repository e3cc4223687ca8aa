"""The embedded ledger decided in memory, for a gateway that is its file's only judge
(``sqlite_write_behind``): reservations and settlements follow the rules of
``sqlite_ledger`` exactly, on counters held here, in microseconds instead of a
transaction. Each step that changes anything comes out as an *entry* — a JSON-ready
dict of what the file must be changed by — for the journal and the flush.

A counter, its rate window and its fired thresholds are read from the file the first
time a request needs them: until then the file's values are the values, since every
change passes through here before it reaches the file. The file's own changes are by
amounts (``value = value + delta``), never by overwriting a value read here, so a
settlement another process writes meanwhile (``portcullis ledger reconcile``) adds to
them instead of being lost; ``clear`` then forgets what was read, to read it again.
"""

from __future__ import annotations

import bisect
import datetime as dt
import sqlite3
from array import array
from dataclasses import replace
from functools import lru_cache
from typing import Any

from portcullis.adapters.store.ledger import Final, Outcome, Reservation, epoch_ms, settle_deltas, thresholds_reached
from portcullis.adapters.store.sqlite_ledger import json_text, marks
from portcullis.engine.governance import WINDOW, WINDOW_MS, Verdict, judge, window_wait_ms, windowed

Entry = dict[str, Any]
_WAIT_ENTRIES = 1000  # a blocked window's oldest entries that its wait is worked out from, as the file's query reads


class _Window:
    """A rate window's entries as (at_ms, amount), oldest first, in two arrays read from
    a head (16 bytes an entry: a window holds a minute of a busy gateway's requests).
    Entries are not told apart by reservation: the slide and the wait only read times and
    amounts, and a settlement adjusts an entry of its reservation's time still holding
    its reservation's amount — the file's entry or an identical one, leaving the same
    times and amounts as the file's."""

    def __init__(self, rows: list[tuple[int, int]]) -> None:
        rows.sort()
        self._times = array("q", [at_ms for at_ms, _ in rows])
        self._amounts = array("q", [amount for _, amount in rows])
        self._head = 0

    def add(self, at_ms: int, amount: int) -> None:
        times = self._times
        if len(times) == self._head or at_ms >= times[-1]:
            times.append(at_ms)
            self._amounts.append(amount)
        else:  # a clock stepped back: kept in order
            index = bisect.bisect_right(times, at_ms, self._head)
            times.insert(index, at_ms)
            self._amounts.insert(index, amount)

    def slide(self, cutoff_ms: int) -> int | None:
        """Drop the entries at or before ``cutoff_ms``; what they amounted to, or None
        when none had left."""
        head = self._head
        end = bisect.bisect_right(self._times, cutoff_ms, head)
        if end == head:
            return None
        gone = sum(self._amounts[head:end])
        self._head = end
        if end > 4096 and end * 2 > len(self._times):  # give the dropped entries' room back, now and then
            del self._times[:end]
            del self._amounts[:end]
            self._head = 0
        return gone

    def adjust(self, at_ms: int, amount: int, delta: int) -> bool:
        """Move an entry made at ``at_ms`` for ``amount`` by ``delta``; False when none is
        left (it has slid out of the window)."""
        times, amounts = self._times, self._amounts
        index = bisect.bisect_left(times, at_ms, self._head)
        while index < len(times) and times[index] == at_ms:
            if amounts[index] == amount:
                amounts[index] += delta
                return True
            index += 1
        return False

    def oldest(self) -> list[tuple[int, int]]:
        head = self._head
        end = head + _WAIT_ENTRIES
        return list(zip(self._times[head:end], self._amounts[head:end], strict=True))


class LedgerMemory:
    """Counters (``[value, expires_at, peak]``, or None for one the file does not have),
    windows, fired thresholds and the states of the reservations decided since the last
    flush, over ``db`` (read-only here) for what has not been read yet."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._counters: dict[str, list[Any] | None] = {}
        self._windows: dict[str, _Window] = {}
        self._fired: dict[str, set[int]] = {}
        self._reservations: dict[str, tuple[str, int, int]] = {}  # id -> (state, reserved at ms, last entry's seq)

    def clear(self) -> None:
        """Forget everything read from the file (another writer changed it); only call
        with every entry flushed, as the file is then read again."""
        self._counters.clear()
        self._windows.clear()
        self._fired.clear()
        self._reservations.clear()

    def forget_flushed(self, seq: int) -> None:
        """Settled reservations whose entries the file now has: it answers for them."""
        done = [rid for rid, (state, _, last) in self._reservations.items() if state != "open" and last <= seq]
        for rid in done:
            del self._reservations[rid]

    # --- reading -----------------------------------------------------------------------

    def values(self, keys: list[str]) -> dict[str, list[Any]]:
        self._load(keys)
        return {key: counter for key in keys if (counter := self._counters.get(key)) is not None}

    def _load(self, keys: list[str]) -> None:
        missing = [key for key in dict.fromkeys(keys) if key not in self._counters]
        if not missing:
            return
        rows = self._db.execute(f"SELECT key, value, expires_at, peak FROM counters WHERE key IN ({marks(len(missing))})", missing).fetchall()
        found = {key: [value, expires_at, peak] for key, value, expires_at, peak in rows}
        for key in missing:
            self._counters[key] = found.get(key)

    def _window(self, key: str) -> _Window:
        window = self._windows.get(key)
        if window is None:
            rows = self._db.execute("SELECT at_ms, amount FROM window_entries WHERE counter = ?", (key,)).fetchall()
            window = self._windows[key] = _Window(rows)
        return window

    def _reservation(self, reservation_id: str) -> tuple[str, int] | None:
        known = self._reservations.get(reservation_id)
        if known is not None:
            return known[0], known[1]
        row = self._db.execute("SELECT state, created_at FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
        if row is None:
            return None
        return row[0], epoch_ms(dt.datetime.fromisoformat(row[1]))

    # --- deciding ----------------------------------------------------------------------

    def reserve(self, reservation: Reservation, seq: int) -> tuple[Verdict, Entry | None]:
        """``sqlite_ledger._reserve``'s verdict, and the entry that records it (None when
        nothing changed). ``seq`` numbers the entry."""
        charges = reservation.charges
        now_ms = epoch_ms(reservation.created_at)
        keys = list(dict.fromkeys(charge.key for charge in charges))
        self._load(keys)
        cutoff = now_ms - WINDOW_MS
        gone: dict[str, int] = {}
        for key in dict.fromkeys(charge.key for charge in charges if windowed(charge.limit.period)):
            amount = self._window(key).slide(cutoff)
            if amount is not None:
                gone[key] = amount
        slides = [[key, cutoff] for key in gone]
        stored = {key: counter for key in keys if (counter := self._counters[key]) is not None}
        current = {key: counter[0] - gone.get(key, 0) for key, counter in stored.items()}
        verdict = judge(charges, current)
        if verdict.blocked is not None:
            slid = [[key, -amount] for key, amount in gone.items() if key in stored]
            for key, delta in slid:
                stored[key][0] += delta
            entry = {"seq": seq, "op": "slide", "slides": slides, "counters": slid} if slides else None
            blocked = verdict.blocked
            if windowed(blocked.limit.period):
                wait = window_wait_ms(self._window(blocked.key).oldest(), current.get(blocked.key, 0), blocked, now_ms)
                verdict = replace(verdict, retry_after_ms=wait)
            return verdict, entry
        totals: dict[str, int] = dict.fromkeys(keys, 0)
        expiries: dict[str, str] = {}
        for charge in charges:
            totals[charge.key] += charge.amount
            expiries[charge.key] = max(expiries.get(charge.key, ""), _iso(charge.expires_at))
        counters = []
        for key in keys:
            value = current.get(key, 0) + totals[key]
            counter = stored.get(key)
            if counter is None:
                self._counters[key] = [value, expiries[key], value]
            else:
                counter[0], counter[1], counter[2] = value, max(counter[1], expiries[key]), max(counter[2], value)
            counters.append([key, totals[key] - gone.get(key, 0) if counter is not None else value, expiries[key]])
        windows = [[charge.key, reservation.id, now_ms, charge.amount] for charge in charges if windowed(charge.limit.period)]
        for key, _, at_ms, amount in windows:
            self._windows[key].add(at_ms, amount)
        self._reservations[reservation.id] = ("open", now_ms, seq)
        *row, created_at = reservation.open_row()
        entry = {"seq": seq, "op": "reserve", "row": [*row, created_at.isoformat()], "slides": slides, "counters": counters, "windows": windows}
        return verdict, entry

    def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final, now: str, seq: int) -> tuple[Outcome, Entry | None]:
        """``sqlite_ledger._settle``'s outcome, and the entry that records it (None for a replay)."""
        known = self._reservation(reservation_id)
        allowed = ("open", "pending") if final.state == "reconciled" else ("open",)
        if known is None or known[0] not in allowed:
            return Outcome(known[0] if known else "unknown", replayed=True), None
        previous, reserved_ms = known
        moving: dict[str, int] = {}
        windows = []
        charged = {charge["key"]: charge["amount"] for charge in charges}  # what each window entry was made with
        for key, delta in settle_deltas(charges, final.amounts).items():
            if key.endswith(f"|{WINDOW}"):
                if not self._window(key).adjust(reserved_ms, charged[key], delta):
                    continue  # the entry has left its window: so has what it counted
                windows.append([key, reserved_ms, reservation_id, delta])
            moving[key] = delta
        self._load(list(moving))
        after: list[tuple[str, int]] = []
        for key, delta in moving.items():
            counter = self._counters[key]
            if counter is None:
                continue  # its period is long over
            counter[0] += delta
            counter[2] = max(counter[2], counter[0])
            after.append((key, counter[0]))
        crossings = self._fire(charges, after)
        self._reservations[reservation_id] = (final.state, reserved_ms, seq)
        entry = {
            "seq": seq,
            "op": "settle",
            "id": reservation_id,
            "from": list(allowed),
            "final": [final.state, final.tokens, final.cost_micro_usd, json_text(final.usage), json_text(final.served), now],
            "counters": [[key, moving[key]] for key, _ in after],
            "windows": windows,
            "thresholds": [[key, threshold, now] for key, threshold in crossings],
            "reconciliation": [previous, final.tokens, final.cost_micro_usd, final.note, now] if final.state == "reconciled" else None,
        }
        return Outcome(final.state, thresholds=crossings), entry

    def expiry(self, now: str, seq: int) -> Entry:
        """The entry that sweeps counters expired by ``now`` (and their windows) out of the file."""
        return {"seq": seq, "op": "expire", "before": now}

    def forget_expired(self, now: str) -> None:
        """Forget what the sweep took out of the file: counters expired by ``now``, their
        windows and fired thresholds (read from the file again, should they come back)."""
        gone = [key for key, counter in self._counters.items() if counter is None or counter[1] < now]
        for key in gone:
            del self._counters[key]
            self._fired.pop(key, None)
        for key in [key for key in self._windows if key not in self._counters]:
            del self._windows[key]

    def _fire(self, charges: list[dict[str, Any]], values: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        reached = thresholds_reached(charges, values)
        if not reached:
            return ()
        unread = [key for key in dict.fromkeys(key for key, _ in reached) if key not in self._fired]
        if unread:
            for key in unread:
                self._fired[key] = set()
            for key, threshold in self._db.execute(f"SELECT counter, threshold FROM threshold_events WHERE counter IN ({marks(len(unread))})", unread):
                self._fired[key].add(threshold)
        crossings = tuple((key, threshold) for key, threshold in reached if threshold not in self._fired[key])
        for key, threshold in crossings:
            self._fired[key].add(threshold)
        return crossings


@lru_cache(maxsize=256)
def _iso(when: dt.datetime) -> str:
    """A period's end, spelled once: every reservation of the period charges it."""
    return when.isoformat()
