-- The log of every rate window (a counter keyed `scope|metric|w60`): one entry per
-- reservation still inside its 60 seconds. The window's `counters` row holds their sum.
CREATE TABLE window_entries (
    counter        TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    at_ms          INTEGER NOT NULL,
    amount         INTEGER NOT NULL,
    PRIMARY KEY (counter, reservation_id)
);
CREATE INDEX window_entries_by_age ON window_entries (counter, at_ms);
