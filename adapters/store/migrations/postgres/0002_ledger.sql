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
    charges         JSONB NOT NULL, -- JSON: [{key, metric, amount}] charged to counters at reserve time
    bound_tokens    BIGINT NOT NULL,
    bound_micro_usd BIGINT NOT NULL,
    estimate        TEXT NOT NULL,
    tokens          BIGINT NOT NULL,
    cost_micro_usd  BIGINT NOT NULL,
    usage           JSONB,
    served          JSONB,
    created_at      TIMESTAMPTZ NOT NULL,
    resolved_at     TIMESTAMPTZ
);
CREATE INDEX reservations_team_created ON reservations (team, created_at);
CREATE INDEX reservations_key_created ON reservations (key_id, created_at);
CREATE INDEX reservations_unresolved ON reservations (state, created_at);

CREATE TABLE spend_journal (
    id             BIGSERIAL PRIMARY KEY,
    reservation_id TEXT NOT NULL,
    entry          TEXT NOT NULL,   -- reserve, then the state it moved to: settled | pending | released | reconciled
    tokens_delta   BIGINT NOT NULL,
    cost_delta     BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);

CREATE FUNCTION journal_reservation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
        VALUES (NEW.id, 'reserve', NEW.tokens, NEW.cost_micro_usd, NEW.created_at);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO spend_journal (reservation_id, entry, tokens_delta, cost_delta, created_at)
        VALUES (NEW.id, NEW.state, NEW.tokens - OLD.tokens, NEW.cost_micro_usd - OLD.cost_micro_usd, NEW.resolved_at);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER journal_reservation AFTER INSERT OR UPDATE ON reservations FOR EACH ROW EXECUTE FUNCTION journal_reservation();

CREATE TABLE reconciliations (
    reservation_id TEXT PRIMARY KEY,
    resolution     TEXT NOT NULL,
    tokens         BIGINT NOT NULL,
    cost_micro_usd BIGINT NOT NULL,
    note           TEXT,
    created_at     TIMESTAMPTZ NOT NULL
);

CREATE TABLE threshold_events (
    counter   TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    fired_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (counter, threshold)
);
