"""Embedded store: one SQLite file, for a single gateway process and zero services."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from portcullis.adapters.store import KeyRecord, SealedSecret, migration_files
from portcullis.adapters.store.ledger import Final, Outcome, Reservation, Unresolved, insert_reservation_sql, settle_deltas
from portcullis.engine.governance import WINDOW, WINDOW_MS, Verdict, judge, reached_thresholds, window_wait_ms, windowed

_INSERT_RESERVATION = insert_reservation_sql("?")


class SqliteKeyStore:
    def __init__(self, connection: sqlite3.Connection, applied_migrations: list[str]) -> None:
        self._db = connection
        self.connection = connection  # shared with the ledger
        self.applied_migrations = applied_migrations

    @classmethod
    def open(cls, path: Path) -> SqliteKeyStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Lookups take microseconds, so they run on the event loop instead of paying
        # for a thread hop; busy_timeout covers the CLI writing at the same moment.
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        # A commit survives a crash of the process, not of the machine: the embedded store
        # trades power-loss durability for not waiting on the disk (use the shared store for it).
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("PRAGMA busy_timeout=5000")
        return cls(connection, migrate(connection))

    async def find_by_hash(self, key_hash: str) -> KeyRecord | None:
        row = self._db.execute(
            "SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys WHERE key_hash = ?",
            (key_hash,),
        ).fetchone()
        return _record(row) if row else None

    async def create_key(self, record: KeyRecord, key_hash: str) -> None:
        self._db.execute(
            "INSERT INTO virtual_keys (key_id, key_hash, team, user_id, name, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (record.key_id, key_hash, record.team, record.user, record.name, record.created_at.isoformat()),
        )

    async def revoke_key(self, key_id: str, when: dt.datetime) -> bool:
        revoked = 0
        for sql in _REVOKE:
            revoked += self._db.execute(sql, (when.isoformat(), key_id)).rowcount
        return revoked == 1

    async def list_keys(self) -> list[KeyRecord]:
        rows = self._db.execute(
            "SELECT key_id, team, user_id, name, created_at, revoked_at FROM virtual_keys"
            " UNION ALL SELECT access_key_id, team, user_id, name, created_at, revoked_at FROM aws_credentials ORDER BY created_at"
        ).fetchall()
        return [_record(row) for row in rows]

    async def create_aws_credential(self, record: KeyRecord, sealed: SealedSecret) -> None:
        self._db.execute(
            "INSERT INTO aws_credentials (access_key_id, sealed_secret, seal_key_id, team, user_id, name, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.key_id, sealed.blob, sealed.seal_key_id, record.team, record.user, record.name, record.created_at.isoformat()),
        )

    async def find_aws_credential(self, access_key_id: str) -> tuple[KeyRecord, SealedSecret] | None:
        row = self._db.execute(f"{_AWS_SELECT} WHERE access_key_id = ?", (access_key_id,)).fetchone()
        return _aws_record(row) if row else None

    async def aws_credentials(self) -> list[tuple[KeyRecord, SealedSecret]]:
        return [_aws_record(row) for row in self._db.execute(f"{_AWS_SELECT} ORDER BY created_at").fetchall()]

    async def replace_sealed(self, access_key_id: str, old: SealedSecret, new: SealedSecret) -> bool:
        cursor = self._db.execute(
            "UPDATE aws_credentials SET sealed_secret = ?, seal_key_id = ? WHERE access_key_id = ? AND sealed_secret = ?",
            (new.blob, new.seal_key_id, access_key_id, old.blob),
        )
        return cursor.rowcount == 1

    async def close(self) -> None:
        self._db.close()


_REVOKE = (
    "UPDATE virtual_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
    "UPDATE aws_credentials SET revoked_at = ? WHERE access_key_id = ? AND revoked_at IS NULL",
)
_AWS_SELECT = "SELECT access_key_id, team, user_id, name, created_at, revoked_at, seal_key_id, sealed_secret FROM aws_credentials"


def _aws_record(row: tuple) -> tuple[KeyRecord, SealedSecret]:
    return _record(row[:6]), SealedSecret(row[6], bytes(row[7]))


def _record(row: tuple) -> KeyRecord:
    key_id, team, user, name, created, revoked = row
    return KeyRecord(key_id, team, user, name, dt.datetime.fromisoformat(created), dt.datetime.fromisoformat(revoked) if revoked else None)


def migrate(connection: sqlite3.Connection) -> list[str]:
    """Apply pending migrations, each in its own transaction; returns what was applied."""
    connection.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    done = {row[0] for row in connection.execute("SELECT version FROM schema_migrations")}
    applied = []
    for version, name, sql in migration_files("sqlite"):
        if version in done:
            continue
        applied_at = dt.datetime.now(dt.UTC).isoformat()
        try:  # executescript: trigger bodies hold semicolons a plain split would break
            connection.executescript(f"BEGIN IMMEDIATE;\n{sql}\nINSERT INTO schema_migrations VALUES ({version}, '{name}', '{applied_at}');\nCOMMIT;")
        except Exception:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied


class SqliteLedger:
    """The embedded ledger: counters, reservations and journal in one SQLite file, each
    reservation and settlement one ``BEGIN IMMEDIATE`` transaction (so several
    processes sharing the file stay exact too)."""

    def __init__(self, connection: sqlite3.Connection, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._db = connection
        self._clock = clock
        self._since_cleanup = 0

    async def reserve(self, reservation: Reservation, fail_open: bool = False) -> Verdict:
        keys = [charge.key for charge in reservation.charges]
        now_ms = _ms(reservation.created_at)
        with _transaction(self._db):
            for charge in reservation.charges:
                if windowed(charge.limit.period):
                    self._slide(charge.key, now_ms)
            current = dict(self._db.execute(f"SELECT key, value FROM counters WHERE key IN ({','.join('?' * len(keys))})", keys).fetchall()) if keys else {}
            verdict = judge(reservation.charges, current)
            if verdict.blocked is not None:
                blocked = verdict.blocked
                if windowed(blocked.limit.period):
                    entries = self._db.execute("SELECT at_ms, amount FROM window_entries WHERE counter = ? ORDER BY at_ms LIMIT 1000", (blocked.key,))
                    return replace(verdict, retry_after_ms=window_wait_ms(entries, current.get(blocked.key, 0), blocked, now_ms))
                return verdict
            for charge in reservation.charges:
                self._db.execute(
                    "INSERT INTO counters (key, value, expires_at, peak) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = value + excluded.value, expires_at = max(expires_at, excluded.expires_at),"
                    " peak = max(peak, value + excluded.value)",  # every SET reads the row as it was
                    (charge.key, charge.amount, charge.expires_at.isoformat(), charge.amount),
                )
                if windowed(charge.limit.period):
                    self._db.execute("INSERT INTO window_entries VALUES (?, ?, ?, ?)", (charge.key, reservation.id, now_ms, charge.amount))
            self._insert(reservation)
        self._cleanup()
        return verdict

    def _slide(self, key: str, now_ms: int) -> None:
        """Drop the entries that have left a window, and their amounts from its total."""
        gone = self._db.execute("DELETE FROM window_entries WHERE counter = ? AND at_ms <= ? RETURNING amount", (key, now_ms - WINDOW_MS)).fetchall()
        if gone:
            self._db.execute("UPDATE counters SET value = value - ? WHERE key = ?", (sum(amount for (amount,) in gone), key))

    def _insert(self, reservation: Reservation) -> None:
        *values, created_at = reservation.open_row()
        self._db.execute(_INSERT_RESERVATION, (*values, created_at.isoformat()))

    async def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final) -> Outcome:
        from_states = ("open", "pending") if final.state == "reconciled" else ("open",)
        crossings: list[tuple[str, int]] = []
        with _transaction(self._db):
            row = self._db.execute("SELECT state, tokens, cost_micro_usd FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
            if row is None or row[0] not in from_states:
                return Outcome(row[0] if row else "unknown", replayed=True)
            now = self._clock().isoformat()
            self._db.execute(
                "UPDATE reservations SET state = ?, tokens = ?, cost_micro_usd = ?, usage = ?, served = ?, resolved_at = ? WHERE id = ?",
                (final.state, final.tokens, final.cost_micro_usd, _json(final.usage), _json(final.served), now, reservation_id),
            )
            for key, delta in settle_deltas(charges, final.amounts).items():
                if key.endswith(f"|{WINDOW}"):
                    # A window's total moves only while the entry is still in it.
                    moved = self._db.execute(
                        "UPDATE window_entries SET amount = amount + ? WHERE counter = ? AND reservation_id = ? RETURNING amount", (delta, key, reservation_id)
                    ).fetchone()
                    if moved is None:
                        continue
                after = self._db.execute(
                    "UPDATE counters SET value = value + ?, peak = max(peak, value + ?) WHERE key = ? RETURNING value", (delta, delta, key)
                ).fetchone()
                if after is None:
                    continue  # the counter's period is long over
                charge = next(c for c in charges if c["key"] == key)
                for threshold in reached_thresholds(charge, after[0]):
                    fired = self._db.execute("INSERT OR IGNORE INTO threshold_events (counter, threshold, fired_at) VALUES (?, ?, ?)", (key, threshold, now))
                    if fired.rowcount:
                        crossings.append((key, threshold))
            if final.state == "reconciled":
                self._db.execute(
                    "INSERT INTO reconciliations (reservation_id, resolution, tokens, cost_micro_usd, note, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (reservation_id, row[0], final.tokens, final.cost_micro_usd, final.note, now),
                )
        return Outcome(final.state, thresholds=tuple(crossings))

    async def unresolved(self, older_than: dt.datetime) -> list[Unresolved]:
        rows = self._db.execute(
            "SELECT id, request_id, state, charges, bound_tokens, bound_micro_usd, usage, served, created_at FROM reservations"
            " WHERE state = 'pending' OR (state = 'open' AND created_at < ?) ORDER BY created_at",
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

    async def counter(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE key = ?", (key,)).fetchone()
        return row[0] if row else 0

    async def peaks(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        return dict(self._db.execute(f"SELECT key, peak FROM counters WHERE key IN ({','.join('?' * len(keys))})", keys).fetchall())

    async def close(self) -> None:
        return None  # the connection belongs to the key store

    def _cleanup(self) -> None:
        self._since_cleanup += 1
        if self._since_cleanup >= 1000:
            self._since_cleanup = 0
            with _transaction(self._db):
                self._db.execute("DELETE FROM counters WHERE expires_at < ?", (self._clock().isoformat(),))
                # A window's counter expires minutes after its last entry: what is left of its log is long out of it.
                self._db.execute("DELETE FROM window_entries WHERE counter NOT IN (SELECT key FROM counters)")


@contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def _json(value: Any) -> str | None:
    return json.dumps(value) if value is not None else None
