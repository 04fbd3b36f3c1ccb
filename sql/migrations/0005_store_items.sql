-- 0005_store_items: key-value items of the long-term memory store (LangGraph's BaseStore), with
-- the vectors and BM25 terms of their indexed texts. `session_id` is the item's owner, read from
-- its namespace: ("sessions", ID, ...) -> ID, ("users", ID, ...) -> '@user:ID' (the owner of the
-- user's pins); other namespaces have none. Erasing a session or a user erases what it owns.

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
