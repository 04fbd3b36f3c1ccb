-- schema.sql: the current catalog in one file (must equal all migrations applied in order).
-- @DIM@ is replaced by the embedder dimension recorded in cce_meta.

CREATE TABLE cce_meta (
    key VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

CREATE TABLE sessions (
    session_id VARCHAR PRIMARY KEY,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    status VARCHAR NOT NULL DEFAULT 'open',
    next_turn INTEGER NOT NULL DEFAULT 0,
    user_id VARCHAR
);

CREATE TABLE turns (
    session_id VARCHAR NOT NULL,
    turn_no INTEGER NOT NULL,
    role VARCHAR NOT NULL,
    speaker VARCHAR,
    content VARCHAR,
    ts TIMESTAMP NOT NULL,
    tokens INTEGER NOT NULL,
    n_terms INTEGER NOT NULL,
    content_hash UBIGINT NOT NULL,
    micro VARCHAR,
    note_id BIGINT,
    message_id VARCHAR,
    PRIMARY KEY (session_id, turn_no)
);

CREATE SEQUENCE note_ids START 1;

CREATE TABLE notes (
    note_id BIGINT PRIMARY KEY,
    session_id VARCHAR NOT NULL,
    start_turn INTEGER NOT NULL,
    end_turn INTEGER NOT NULL,
    start_ts TIMESTAMP NOT NULL,
    end_ts TIMESTAMP NOT NULL,
    label VARCHAR NOT NULL,
    summary VARCHAR NOT NULL,
    raw_tokens INTEGER NOT NULL,
    summary_tokens INTEGER NOT NULL,
    level SMALLINT NOT NULL DEFAULT 0,
    retrieval_count INTEGER NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    vector TINYINT[@DIM@] NOT NULL
);

CREATE TABLE message_vectors (
    session_id VARCHAR NOT NULL,
    turn_no INTEGER NOT NULL,
    vector TINYINT[@DIM@] NOT NULL
);

CREATE TABLE sentence_vectors (
    session_id VARCHAR NOT NULL,
    turn_no INTEGER NOT NULL,
    sent_no SMALLINT NOT NULL,
    start_char INTEGER NOT NULL,
    end_char INTEGER NOT NULL,
    vector TINYINT[@DIM@] NOT NULL
);

CREATE TABLE postings (
    session_id VARCHAR NOT NULL,
    term VARCHAR NOT NULL,
    turn_no INTEGER NOT NULL,
    tf SMALLINT NOT NULL
);

CREATE SEQUENCE pin_ids START 1;

CREATE TABLE pins (
    pin_id BIGINT PRIMARY KEY,
    session_id VARCHAR NOT NULL,
    text VARCHAR NOT NULL,
    turn_no INTEGER,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);

CREATE TABLE session_summaries (
    session_id VARCHAR PRIMARY KEY,
    summary VARCHAR NOT NULL,
    tokens INTEGER NOT NULL,
    created_at TIMESTAMP NOT NULL
);

CREATE SEQUENCE bullet_ids START 1;

CREATE TABLE playbook_bullets (
    bullet_id BIGINT PRIMARY KEY,
    playbook VARCHAR NOT NULL,
    section VARCHAR NOT NULL,
    content VARCHAR NOT NULL,
    helpful INTEGER NOT NULL DEFAULT 0,
    harmful INTEGER NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    vector TINYINT[@DIM@]
);

CREATE TABLE llm_cache (
    key VARCHAR PRIMARY KEY,
    model VARCHAR NOT NULL,
    response VARCHAR NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    created_at TIMESTAMP NOT NULL
);

CREATE TABLE context_calls (
    session_id VARCHAR NOT NULL,
    called_at TIMESTAMP NOT NULL,
    max_tokens INTEGER NOT NULL,
    tokens_sent INTEGER NOT NULL,
    history_tokens INTEGER NOT NULL
);

CREATE SEQUENCE store_item_ids START 1;

CREATE TABLE store_items (
    item_id BIGINT PRIMARY KEY,
    session_id VARCHAR,
    namespace VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value VARCHAR NOT NULL,
    n_terms INTEGER NOT NULL,
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    UNIQUE (namespace, key)
);

CREATE TABLE store_item_vectors (
    session_id VARCHAR,
    item_id BIGINT NOT NULL,
    text_no INTEGER NOT NULL,
    path VARCHAR NOT NULL,
    vector TINYINT[@DIM@] NOT NULL
);

CREATE TABLE store_item_postings (
    session_id VARCHAR,
    item_id BIGINT NOT NULL,
    term VARCHAR NOT NULL,
    tf SMALLINT NOT NULL
);
