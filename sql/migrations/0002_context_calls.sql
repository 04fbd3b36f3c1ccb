-- 0002_context_calls: one row per built context, so stats can report tokens sent and saved.

CREATE TABLE context_calls (
    session_id VARCHAR NOT NULL,
    called_at TIMESTAMP NOT NULL,
    max_tokens INTEGER NOT NULL,
    tokens_sent INTEGER NOT NULL,
    history_tokens INTEGER NOT NULL
);
