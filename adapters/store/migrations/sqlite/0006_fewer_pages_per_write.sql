-- The same tables and rows, laid out so that a reservation and its settlement dirty
-- fewer pages: every dirty page is a WAL frame written at commit (two system calls),
-- most of a ledger write's cost. Measured on the quickstart's six charges: 13 frames
-- per request before, 9.9 after.
--   counters, window_entries: WITHOUT ROWID, so the primary key is the table (one
--     b-tree to change instead of a table and its key's index, two for window entries:
--     their key now leads with the time, which serves the window's slide as the
--     separate by-age index did; a settlement knows the time from its reservation);
--   spend_journal: no AUTOINCREMENT (its bookkeeping row in sqlite_sequence was one
--     more page per entry); ids still grow, as nothing is ever deleted from it;
--   reservations_unresolved: only open and pending reservations, the ones reconciliation
--     looks for; settling removes an entry instead of moving it.
-- The journal's triggers name spend_journal, so they are dropped while it is rebuilt.
DROP TRIGGER journal_reserve;
DROP TRIGGER journal_resolve;

CREATE TABLE spend_journal_rebuilt (
    id             INTEGER PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    entry          TEXT NOT NULL,
    tokens_delta   INTEGER NOT NULL,
    cost_delta     INTEGER NOT NULL,
    created_at     TEXT NOT NULL
);
INSERT INTO spend_journal_rebuilt (id, reservation_id, entry, tokens_delta, cost_delta, created_at)
    SELECT id, reservation_id, entry, tokens_delta, cost_delta, created_at FROM spend_journal;
DROP TABLE spend_journal;
ALTER TABLE spend_journal_rebuilt RENAME TO spend_journal;
DELETE FROM sqlite_sequence WHERE name = 'spend_journal';

CREATE TABLE counters_rebuilt (
    key        TEXT PRIMARY KEY,
    value      INTEGER NOT NULL,
    expires_at TEXT NOT NULL,
    peak       INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
INSERT INTO counters_rebuilt (key, value, expires_at, peak) SELECT key, value, expires_at, peak FROM counters;
DROP TABLE counters;
ALTER TABLE counters_rebuilt RENAME TO counters;

CREATE TABLE window_entries_rebuilt (
    counter        TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    at_ms          INTEGER NOT NULL,
    amount         INTEGER NOT NULL,
    PRIMARY KEY (counter, at_ms, reservation_id)
) WITHOUT ROWID;
INSERT INTO window_entries_rebuilt (counter, reservation_id, at_ms, amount) SELECT counter, reservation_id, at_ms, amount FROM window_entries;
DROP TABLE window_entries;
ALTER TABLE window_entries_rebuilt RENAME TO window_entries;

DROP INDEX reservations_unresolved;
CREATE INDEX reservations_unresolved ON reservations (state, created_at) WHERE state IN ('open', 'pending');

CREATE TRIGGER journal_reserve AFTER INSERT ON reservations BEGIN
    INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
    VALUES (NEW.id, 'reserve', NEW.tokens, NEW.cost_micro_usd, NEW.created_at);
END;

CREATE TRIGGER journal_resolve AFTER UPDATE OF state ON reservations WHEN NEW.state IS NOT OLD.state BEGIN
    INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
    VALUES (NEW.id, NEW.state, NEW.tokens - OLD.tokens, NEW.cost_micro_usd - OLD.cost_micro_usd, NEW.resolved_at);
END;
