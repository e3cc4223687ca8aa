"""Group commit for the embedded ledger: the writes that arrive while other requests are
in flight share one ``BEGIN IMMEDIATE`` transaction, so a commit (most of a write's cost)
is paid once per batch instead of once per request.

Each write still runs on the values the writes before it left, in arrival order, and
inside a savepoint of its own: a write that fails is undone alone and only its caller
sees the error. A caller's write is committed before its ``run`` returns. A lone write
runs at once, in its own transaction, exactly as it would without batching.

The write lock is taken without blocking the event loop. With several gateway processes
(``workers``) on one file, another process often holds it for a few hundred
microseconds; SQLite's own busy handler would wait for it by sleeping the whole thread
(1 ms and more per try, every request of the process stalled). So the transaction
begins with no busy wait at all, and a locked file is tried again after an *asyncio*
sleep that starts at 100 µs: the process serves other requests meanwhile, and the
writes that queue up in that time join the batch.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from portcullis.adapters.store import StoreUnavailable

T = TypeVar("T")

LOCK_WAIT_SECONDS = 5.0  # as long as the connection's own busy_timeout: then the write fails
_FIRST_RETRY_SECONDS = 0.0001
_LONGEST_RETRY_SECONDS = 0.002

Write = Callable[[sqlite3.Connection], Any]


@dataclass
class _Queued:
    write: Write
    future: asyncio.Future[Any]
    skip_if_abandoned: bool  # a write nobody waits for any more is not run (a reservation)


class GroupCommit:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._queue: list[_Queued] = []
        self._flusher: asyncio.Task[None] | None = None  # commits what is queued, batch after batch
        self.batches = 0  # transactions committed, and the writes they carried: for tests and benchmarks
        self.writes = 0

    async def run(self, write: Callable[[sqlite3.Connection], T], batch: bool, skip_if_abandoned: bool = False) -> T:
        """Run ``write`` in a transaction and commit it. With ``batch`` (other requests are
        in flight, so more writes are coming), it waits for the rest of this turn of the
        event loop and commits with the writes queued meanwhile; it always joins a batch
        already waiting."""
        if not self._queue and not batch and self._flusher is None and self._begin():
            [(ok, value)] = self._commit([write])
            if not ok:
                raise value
            return value
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Queued(write, future, skip_if_abandoned))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Commit what is queued, batch after batch, until nothing is."""
        try:
            while self._queue:
                try:
                    await self._lock()
                except Exception as error:  # the file stayed locked (or broke): every queued write fails
                    queued, self._queue = self._queue, []
                    for item in queued:
                        if not item.future.done():
                            item.future.set_exception(error)
                    continue
                queued, self._queue = self._queue, []
                queued = [item for item in queued if not (item.skip_if_abandoned and item.future.cancelled())]
                if not queued:
                    self._db.execute("ROLLBACK")
                    continue
                for item, (ok, value) in zip(queued, self._commit([item.write for item in queued]), strict=True):
                    if item.future.cancelled():
                        continue  # committed all the same: the caller stopped waiting
                    if ok:
                        item.future.set_result(value)
                    else:
                        item.future.set_exception(value)
        finally:
            self._flusher = None

    def _begin(self) -> bool:
        """Begin the write transaction if the file's write lock is free now; False if
        another connection holds it. Never waits."""
        db = self._db
        db.execute("PRAGMA busy_timeout = 0")
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if db.in_transaction or "locked" not in str(error):
                raise
            return False
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT_SECONDS * 1000)}")
        return True

    async def _lock(self) -> None:
        """Begin the write transaction, yielding to the event loop while another
        process holds the lock."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOCK_WAIT_SECONDS
        delay = _FIRST_RETRY_SECONDS
        while not self._begin():
            if loop.time() >= deadline:  # the callers fail closed (refused with a retry-after), as for any unreachable store
                raise StoreUnavailable(f"the ledger's SQLite file stayed locked by another process for {LOCK_WAIT_SECONDS:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LONGEST_RETRY_SECONDS)

    def _commit(self, writes: list[Write]) -> list[tuple[bool, Any]]:
        """In the transaction ``_begin`` opened: (True, result) or (False, error) for each
        write. A failure of the transaction itself (it could not commit) fails every write in it."""
        db = self._db
        try:
            # A lone write needs no savepoint: its error rolls the whole transaction back.
            outcomes = [(True, writes[0](db))] if len(writes) == 1 else [self._in_savepoint(write) for write in writes]
            db.execute("COMMIT")
        except Exception as error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            return [(False, error)] * len(writes)
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self.batches += 1
        self.writes += len(writes)
        return outcomes

    def _in_savepoint(self, write: Write) -> tuple[bool, Any]:
        db = self._db
        db.execute("SAVEPOINT write")
        try:
            value = write(db)
        except Exception as error:
            # Undo this write alone; if even that fails, the transaction is lost and every write with it.
            db.execute("ROLLBACK TO write")
            db.execute("RELEASE write")
            return False, error
        db.execute("RELEASE write")
        return True, value
