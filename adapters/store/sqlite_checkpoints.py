"""WAL checkpoints off the request path.

SQLite's own checkpoint runs inside the commit that fills the WAL past a threshold: that
request waits for the copy into the database file and its fsyncs (milliseconds; the
ledger's p99). Here a thread of its own, on a connection of its own, copies the WAL back
a little at a time (PASSIVE: never waiting for, nor blocking, a reader or a writer),
with the GIL released while SQLite works. Safe with several processes on one file: a
checkpoint another process is running makes this one a no-op. The commits keep SQLite's
own checkpoint as a backstop, at a threshold this thread keeps the WAL well below.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("portcullis.store")

INTERVAL_SECONDS = 0.1  # a busy gateway writes ~1,000 WAL pages (4 MB) in this time
BACKSTOP_PAGES = 10_000  # the committing connection checkpoints itself past this (~40 MB)


class Checkpointer:
    def __init__(self, path: Path, synchronous: str, interval: float = INTERVAL_SECONDS) -> None:
        self._path = path
        self._synchronous = synchronous
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="portcullis-sqlite-checkpoint", daemon=True)
        self.checkpoints = 0  # completed passes, for tests

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        connection = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            # The copy must reach the disk before the WAL frames it replaces are reused.
            connection.execute(f"PRAGMA synchronous={self._synchronous}")
            failing = False
            while not self._stop.wait(self._interval):
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as error:  # busy or short of disk: the next pass, or the backstop, catches up
                    if not failing:  # once per run of failures, not ten times a second
                        log.warning("WAL checkpoint of the embedded store failed: %s", error)
                    failing = True
                    continue
                failing = False
                self.checkpoints += 1
        finally:
            connection.close()
