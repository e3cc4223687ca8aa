-- The durable ledger. A reservation row is one billable call (a request's main call
-- or an auxiliary sub-call); tokens and cost hold what it is charged now: the bound
-- while open or pending, the real usage once settled. The journal is append-only and
-- written by the database itself, so no change to a reservation can skip it.
CREATE TABLE reservations (
    id              TEXT PRIMARY KEY,
    request_id      TEXT NOT NULL,
    subcall         TEXT NOT NULL,
    team            TEXT,
    user_id         TEXT,
    key_id          TEXT,
    state           TEXT NOT NULL,  -- open | settled | pending | released | reconciled
    charges         TEXT NOT NULL,  -- JSON: [{key, metric, amount}] charged to counters at reserve time
    bound_tokens    INTEGER NOT NULL,
    bound_micro_usd INTEGER NOT NULL,
    estimate        TEXT NOT NULL,
    tokens          INTEGER NOT NULL,
    cost_micro_usd  INTEGER NOT NULL,
    usage           TEXT,
    served          TEXT,
    created_at      TEXT NOT NULL,
    resolved_at     TEXT
);
CREATE INDEX reservations_unresolved ON reservations (state, created_at);

CREATE TABLE spend_journal (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    reservation_id TEXT NOT NULL,
    entry          TEXT NOT NULL,   -- reserve, then the state it moved to: settled | pending | released | reconciled
    tokens_delta   INTEGER NOT NULL,
    cost_delta     INTEGER NOT NULL,
    created_at     TEXT NOT NULL
);

CREATE TRIGGER journal_reserve AFTER INSERT ON reservations BEGIN
    INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
    VALUES (NEW.id, 'reserve', NEW.tokens, NEW.cost_micro_usd, NEW.created_at);
END;

CREATE TRIGGER journal_resolve AFTER UPDATE OF state ON reservations WHEN NEW.state IS NOT OLD.state BEGIN
    INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
    VALUES (NEW.id, NEW.state, NEW.tokens - OLD.tokens, NEW.cost_micro_usd - OLD.cost_micro_usd, NEW.resolved_at);
END;

-- Hot counters for the embedded mode; the shared mode keeps them in Redis.
CREATE TABLE counters (
    key        TEXT PRIMARY KEY,
    value      INTEGER NOT NULL,
    expires_at TEXT NOT NULL
);

CREATE TABLE reconciliations (
    reservation_id TEXT PRIMARY KEY,
    resolution     TEXT NOT NULL,
    tokens         INTEGER NOT NULL,
    cost_micro_usd INTEGER NOT NULL,
    note           TEXT,
    created_at     TEXT NOT NULL
);

CREATE TABLE threshold_events (
    counter   TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    fired_at  TEXT NOT NULL,
    PRIMARY KEY (counter, threshold)
);
