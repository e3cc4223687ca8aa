-- The durable ledger. A reservation row is one billable call (a request's main call
-- or an auxiliary sub-call); tokens and cost hold what it is charged now: the bound
-- while open or pending, the real usage once settled. The journal is append-only.
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
CREATE INDEX reservations_team_created ON reservations (team, created_at);
CREATE INDEX reservations_key_created ON reservations (key_id, created_at);
CREATE INDEX reservations_unresolved ON reservations (state, created_at);

CREATE TABLE spend_journal (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    reservation_id TEXT NOT NULL,
    entry          TEXT NOT NULL,   -- reserve | settle | pending | release | reconcile
    tokens_delta   INTEGER NOT NULL,
    cost_delta     INTEGER NOT NULL,
    created_at     TEXT NOT NULL
);

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
