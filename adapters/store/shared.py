"""The shared ledger: Redis owns the hot counters, PostgreSQL the durable record.

Reserving runs one Lua script that checks every counter a request charges and, only
if all stay within their limits, adds to all of them: nothing can interleave, so
concurrent requests on any number of replicas never pass a hard limit together. The
reservation is then written to PostgreSQL before the request is dispatched; the commit
waits for what ``store.durability`` asks (``connections.SYNCHRONOUS_COMMIT``). The row
is written only once the script admitted it: a counter loaded from PostgreSQL then
never meets a reservation that its script will add again (an overlapped insert
would be counted twice by a concurrent load, and refuse what fits).
A rate window (``…|w60``) is a log of its entries beside its total; the same script
drops what has left the window before it checks.

Redis is a cache of the ledger: a counter Redis does not have (a new period, a rule
added mid-period, a flushed or replaced Redis) is loaded from PostgreSQL's
reservations before the script admits anything against it. A calendar counter's
high-water mark (``…:peak``, what budget tiers read) rises in the same scripts and is
rebuilt with it, by replaying the period's reservations in time order.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis
from redis.exceptions import RedisError

from portcullis.adapters.store import StoreUnavailable
from portcullis.adapters.store.ledger import Final, Outcome, Reservation, Unresolved, epoch_ms, insert_reservation_sql, settle_deltas
from portcullis.adapters.store.redis_scripts import LOAD_WINDOW, RESERVE, SETTLE
from portcullis.engine.governance import COST, REQUESTS, TOKENS, WINDOW, WINDOW_MS, Verdict, instance_expiry, period_range, reached_thresholds, windowed

_INSERT_RESERVATION = insert_reservation_sql("%s")

log = logging.getLogger("portcullis.ledger")

# One statement, so one round trip and one transaction: lock the row, move it to its
# final state only from an allowed one (the journal trigger records the move), and
# record a reconciliation.
# A concurrent replay waits on the row lock, then finds the state moved on: no change.
_SETTLE_SQL = """
WITH previous AS (
    SELECT state, tokens, cost_micro_usd FROM reservations WHERE id = %(id)s FOR UPDATE
), updated AS (
    UPDATE reservations SET state = %(state)s, tokens = %(tokens)s, cost_micro_usd = %(cost)s, usage = %(usage)s, served = %(served)s,
           resolved_at = %(now)s
    WHERE id = %(id)s AND state = ANY(%(from)s) RETURNING id
), reconciliation AS (
    INSERT INTO reconciliations (reservation_id, resolution, tokens, cost_micro_usd, note, created_at)
    SELECT %(id)s, previous.state, %(tokens)s, %(cost)s, %(note)s, %(now)s FROM previous, updated WHERE %(reconcile)s
)
SELECT previous.state, EXISTS (SELECT 1 FROM updated) FROM previous
"""

_MARKER_SECONDS = 40 * 24 * 3600


class SharedLedger:
    def __init__(self, redis: Redis, pool: AsyncConnectionPool, prefix: str, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._redis = redis
        self._pool = pool
        self._prefix = prefix
        self._clock = clock
        self._reserve_script = redis.register_script(RESERVE)
        self._settle_script = redis.register_script(SETTLE)
        self._load_window_script = redis.register_script(LOAD_WINDOW)
        self._fired: set[tuple[str, int]] = set()

    def _key(self, counter: str) -> str:
        return f"{self._prefix}counter:{counter}"

    def _reserved_marker(self, reservation_id: str) -> str:
        return f"{self._prefix}reserved:{reservation_id}"

    async def reserve(self, reservation: Reservation, fail_open: bool = False) -> Verdict:
        charges = reservation.charges
        keys = [self._key(charge.key) for charge in charges]
        args: list[Any] = []
        for charge in charges:
            limit = charge.limit
            block, warn = -1 if limit.block is None else limit.block, -1 if limit.warn is None else limit.warn
            args += [charge.amount, block, 1 if limit.hard else 0, warn, 1 if windowed(limit.period) else 0]
        args += [epoch_ms(reservation.created_at), reservation.id]
        result: list[Any] = [b"ok"]
        try:
            for _ in range(3):
                result = await self._reserve_script(keys=[*keys, self._reserved_marker(reservation.id)], args=args) if keys else [b"ok"]
                if result[0] != b"missing":
                    break
                for index in result[1:]:
                    await self._load(charges[int(index) - 1], reservation.created_at)
            else:
                raise RedisError("counters could not be loaded from the ledger")
        except (RedisError, StoreUnavailable) as error:
            if not fail_open:
                raise StoreUnavailable(f"the counters are unavailable: {type(error).__name__}") from None
            await self._record(reservation)  # no counters, but the spend is not lost
            return Verdict(None, (), unmetered=True)
        if result[0] == b"blocked":
            wait = int(result[2])
            return Verdict(charges[int(result[1]) - 1], (), retry_after_ms=wait if wait >= 0 else None)
        try:
            await self._record(reservation)
        except StoreUnavailable:
            await self._take_back(self._reserved_marker(reservation.id), reservation.id, {c.key: c.amount for c in charges})
            raise
        return Verdict(None, tuple(charges[int(index) - 1] for index in result[1:]))

    async def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final) -> Outcome:
        """Redis first, then PostgreSQL: if a counter is reloaded in between, it is reloaded
        from the unsettled row (the bound): over, never under. A PostgreSQL failure, or a
        row that had already moved to another final state, takes the Redis change back."""
        deltas = settle_deltas(charges, final.amounts)
        marker = f"{self._prefix}settled:{reservation_id}:{final.state}"
        after: list[int] | None = None
        if deltas:
            try:
                after = await self._settle_script(keys=[marker, *(self._key(key) for key in deltas)], args=_settle_args(reservation_id, deltas)) or None
            except RedisError as error:
                # The counters keep the reserved bound (safe, not exact) until their period ends
                # or `portcullis ledger reconcile --reload-counters`.
                log.error("settlement of %s: Redis counters were not adjusted (%s)", reservation_id, type(error).__name__)
        try:
            row = await self._settle_row(reservation_id, final)
        except StoreUnavailable:
            if after is not None:
                await self._take_back(marker, reservation_id, deltas)
            raise
        if row is None or not row[1]:
            previous = row[0] if row else "unknown"
            if after is not None and previous != final.state:  # not a replay of this settlement: another one had won
                await self._take_back(marker, reservation_id, deltas)
            return Outcome(previous, replayed=True)
        reached = []
        for key, value in zip(deltas, after or (), strict=False):
            charge = next(c for c in charges if c["key"] == key)
            if value >= 0:
                reached += [(key, t) for t in reached_thresholds(charge, value) if (key, t) not in self._fired]
        return Outcome(final.state, thresholds=tuple(await self._fire_once(reached)))

    async def _settle_row(self, reservation_id: str, final: Final) -> tuple[str, bool] | None:
        from_states = ["open", "pending"] if final.state == "reconciled" else ["open"]
        try:
            async with self._pool.connection() as connection:
                cursor = await connection.execute(
                    _SETTLE_SQL,
                    {
                        "id": reservation_id,
                        "from": from_states,
                        "state": final.state,
                        "tokens": final.tokens,
                        "cost": final.cost_micro_usd,
                        "usage": _json(final.usage),
                        "served": _json(final.served),
                        "note": final.note,
                        "reconcile": final.state == "reconciled",
                        "now": self._clock(),
                    },
                )
                return await cursor.fetchone()
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None

    async def _take_back(self, marker: str, reservation_id: str, deltas: dict[str, int]) -> None:
        """Apply the opposite of ``deltas`` once: a change PostgreSQL did not confirm."""
        try:
            opposite = {key: -delta for key, delta in deltas.items()}
            await self._settle_script(keys=[f"{marker}:undo", *(self._key(key) for key in deltas)], args=_settle_args(reservation_id, opposite))
            await self._redis.delete(marker)
        except RedisError:
            log.error("a settlement's Redis change could not be taken back; reload counters with `portcullis ledger reconcile --reload-counters`")

    async def unresolved(self, older_than: dt.datetime) -> list[Unresolved]:
        async with self._pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT id, request_id, state, charges, bound_tokens, bound_micro_usd, usage, served, created_at FROM reservations"
                " WHERE state = 'pending' OR (state = 'open' AND created_at < %s) ORDER BY created_at",
                (older_than,),
            )
            return [Unresolved(*row) for row in await cursor.fetchall()]

    async def reload_counters(self) -> int:
        """Forget every cached counter so each is loaded again from PostgreSQL."""
        deleted = 0
        async for key in self._redis.scan_iter(match=f"{self._prefix}counter:*", count=500):
            deleted += await self._redis.delete(key)
        return deleted

    async def counter(self, key: str) -> int:
        value = await self._redis.get(self._key(key))
        return int(value) if value is not None else 0

    async def peaks(self, keys: list[str]) -> dict[str, int]:
        """One MGET. A peak Redis does not have (a new period, a flushed or replaced Redis)
        is loaded with its counter from PostgreSQL first, as a reservation would."""
        return await self._read(keys, ":peak")

    async def values(self, keys: list[str]) -> dict[str, int]:
        """One MGET, a missing counter loaded first as for ``peaks``."""
        return await self._read(keys, "")

    async def _read(self, keys: list[str], suffix: str) -> dict[str, int]:
        if not keys:
            return {}
        redis_keys = [f"{self._key(key)}{suffix}" for key in keys]
        try:
            values = await self._redis.mget(redis_keys)
            missing = [key for key, value in zip(keys, values, strict=True) if value is None and not key.endswith(f"|{WINDOW}")]
            if missing:
                for key in missing:
                    await self._load_counter(key, instance_expiry(key.rsplit("|", 1)[1]))
                values = await self._redis.mget(redis_keys)
        except RedisError as error:
            raise StoreUnavailable(f"the counters are unavailable: {type(error).__name__}") from None
        return {key: int(value) for key, value in zip(keys, values, strict=True) if value is not None}

    async def close(self) -> None:
        return None  # the connections belong to the store

    async def _load(self, charge: Any, now: dt.datetime) -> None:
        """Put a counter Redis lacks back from the durable record of its period, with its
        high-water mark: the period's reservations replayed in time order (each adds its
        bound when made, and moves to its final amount when resolved)."""
        if charge.key.endswith(f"|{WINDOW}"):
            return await self._load_window(charge, now)
        await self._load_counter(charge.key, charge.expires_at)

    async def _load_counter(self, key: str, expires_at: dt.datetime) -> None:
        scope, metric, instance = key.split("|")
        start, end = period_range(instance)
        where, params = _scope_predicate(scope)
        bound, final = _METRIC_COLUMNS[metric]
        try:
            async with self._pool.connection() as connection:
                cursor = await connection.execute(_LOAD_SQL.format(where=where, bound=bound, final=final), (*params, start, end))
                value, peak = await cursor.fetchone()
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None
        expires = int(expires_at.timestamp())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key(key), int(value), nx=True, exat=expires)
            pipe.set(f"{self._key(key)}:peak", max(int(peak), int(value)), nx=True, exat=expires)
            await pipe.execute()

    async def _load_window(self, charge: Any, now: dt.datetime) -> None:
        """Rebuild a window Redis lacks from the reservations made in the 60 seconds before ``now``."""
        scope, metric, _ = charge.key.split("|")
        where, params = _scope_predicate(scope)
        try:
            async with self._pool.connection() as connection:
                cursor = await connection.execute(
                    f"SELECT id, created_at, tokens FROM reservations WHERE {where} AND created_at > %s",
                    (*params, now - dt.timedelta(milliseconds=WINDOW_MS)),
                )
                rows = await cursor.fetchall()
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None
        entries: list[Any] = []
        for reservation_id, created_at, tokens in rows:
            entries += [reservation_id, epoch_ms(created_at), 1 if metric == REQUESTS else tokens]
        await self._load_window_script(keys=[self._key(charge.key)], args=[3 * WINDOW_MS, *entries])

    async def _record(self, reservation: Reservation) -> None:
        row = reservation.open_row()
        try:
            async with self._pool.connection() as connection:
                await connection.execute(_INSERT_RESERVATION, row)
        except (psycopg.OperationalError, TimeoutError) as error:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {type(error).__name__}") from None

    async def _fire_once(self, reached: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The thresholds that fire now: each (counter, threshold) once across replicas."""
        fired: list[tuple[str, int]] = []
        if not reached:
            return fired
        try:
            async with self._pool.connection() as connection:
                for key, threshold in reached:
                    cursor = await connection.execute(
                        "INSERT INTO threshold_events (counter, threshold, fired_at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING counter",
                        (key, threshold, self._clock()),
                    )
                    if await cursor.fetchone():
                        fired.append((key, threshold))
                    self._fired.add((key, threshold))  # recorded, here or by another replica: not asked again
        except (psycopg.Error, TimeoutError):
            log.error("budget threshold events could not be recorded; they fire on a later settlement")
        return fired


# What a reservation charges a counter of each metric: when made, then once resolved.
_METRIC_COLUMNS = {REQUESTS: ("1", "1"), TOKENS: ("bound_tokens", "tokens"), COST: ("bound_micro_usd", "cost_micro_usd")}

# A counter's value and high-water mark from its period's reservations: every
# reservation adds its bound when it is made and moves to what it is charged now when
# it is resolved; the running sum of those steps, in time order, peaks where the
# counter did (a resolution between, e.g. pending then reconciled, is not kept).
_LOAD_SQL = """
WITH charged AS (
    SELECT created_at, resolved_at, {bound} AS bound, {final} AS final FROM reservations
    WHERE {where} AND created_at >= %s AND created_at < %s
), steps AS (
    SELECT created_at AS at, 0 AS nth, bound AS delta FROM charged
    UNION ALL SELECT resolved_at, 1, final - bound FROM charged WHERE resolved_at IS NOT NULL
), running AS (
    SELECT delta, sum(delta) OVER (ORDER BY at, nth ROWS UNBOUNDED PRECEDING) AS total FROM steps
)
SELECT coalesce(sum(delta), 0), coalesce(max(total), 0) FROM running
"""


def _scope_predicate(scope: str) -> tuple[str, tuple[str, ...]]:
    if scope == "org":
        return "TRUE", ()
    kind, _, name = scope.partition(":")
    if kind == "team":
        return "team = %s", (name,)
    if kind == "user":
        team, _, user = name.partition("/")
        return "team = %s AND user_id = %s", (team, user)
    return "key_id = %s", (name,)


def _settle_args(reservation_id: str, deltas: dict[str, int]) -> list[Any]:
    args: list[Any] = [_MARKER_SECONDS, reservation_id]
    for key, delta in deltas.items():
        args += [delta, 1 if key.endswith(f"|{WINDOW}") else 0]
    return args


def _json(value: Any) -> str | None:
    return json.dumps(value) if value is not None else None
