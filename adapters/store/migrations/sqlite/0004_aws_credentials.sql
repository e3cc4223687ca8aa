-- AWS-style credentials (SigV4). Verifying a signature needs the secret itself, so it
-- is stored sealed (AES-256-GCM under a server key named by seal_key_id), never in clear.
CREATE TABLE aws_credentials (
    access_key_id TEXT PRIMARY KEY,
    sealed_secret BLOB NOT NULL,
    seal_key_id   TEXT NOT NULL,
    team          TEXT NOT NULL,
    user_id       TEXT,
    name          TEXT,
    created_at    TEXT NOT NULL,
    revoked_at    TEXT
);
