-- Virtual keys: only the SHA-256 of a key is ever stored.
CREATE TABLE virtual_keys (
    key_id     TEXT PRIMARY KEY,
    key_hash   TEXT NOT NULL UNIQUE,
    team       TEXT NOT NULL,
    user_id    TEXT,
    name       TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
