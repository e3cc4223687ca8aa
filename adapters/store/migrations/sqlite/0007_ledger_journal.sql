-- The write-behind ledger's bookkeeping (adapters/store/sqlite_write_behind.py): the
-- last journal entry its flushes have applied to this file, so that a journal replayed
-- after a crash applies nothing twice.
CREATE TABLE ledger_journal (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    applied_seq INTEGER NOT NULL
);
INSERT INTO ledger_journal (id, applied_seq) VALUES (1, 0);
