"""Group commit for the embedded ledger: the writes that arrive while other requests are
in flight share one ``BEGIN IMMEDIATE`` transaction, so a commit (most of a write's cost)
is paid once per batch instead of once per request.

Each write still runs on the values the writes before it left, in arrival order, and
inside a savepoint of its own: a write that fails is undone alone and only its caller
sees the error. A caller's write is committed before its ``run`` returns. A lone write
runs at once, in its own transaction, exactly as it would without batching.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

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
        self.batches = 0  # transactions committed, and the writes they carried: for tests and benchmarks
        self.writes = 0

    async def run(self, write: Callable[[sqlite3.Connection], T], batch: bool, skip_if_abandoned: bool = False) -> T:
        """Run ``write`` in a transaction and commit it. With ``batch`` (other requests are
        in flight, so more writes are coming), it waits for the rest of this turn of the
        event loop and commits with the writes queued meanwhile; it always joins a batch
        already waiting."""
        if not self._queue and not batch:
            [(ok, value)] = self._commit([write])
            if not ok:
                raise value
            return value
        loop = asyncio.get_running_loop()
        if not self._queue:
            loop.call_soon(self._flush)
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Queued(write, future, skip_if_abandoned))
        return await future

    def _flush(self) -> None:
        queued, self._queue = self._queue, []
        queued = [item for item in queued if not (item.skip_if_abandoned and item.future.cancelled())]
        if not queued:
            return
        for item, (ok, value) in zip(queued, self._commit([item.write for item in queued]), strict=True):
            if item.future.cancelled():
                continue  # committed all the same: the caller stopped waiting
            if ok:
                item.future.set_result(value)
            else:
                item.future.set_exception(value)

    def _commit(self, writes: list[Write]) -> list[tuple[bool, Any]]:
        """(True, result) or (False, error) for each write. A failure of the transaction
        itself (it could not begin, or commit) fails every write in it."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
        except Exception as error:
            return [(False, error)] * len(writes)
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
