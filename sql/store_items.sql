-- Named queries of the long-term memory store (cce_duck/items.py). Namespaces are stored as
-- their labels joined by '.' (a label never holds a period), so a prefix is a string prefix.

-- name: item_get
-- One item by namespace and key.
SELECT item_id, namespace, key, value, created_at, updated_at
FROM main.store_items WHERE namespace = $ns AND key = $key;

-- name: item_candidates
-- The items under a namespace prefix ('' for all), in the order they were first stored.
SELECT item_id, namespace, key, value, n_terms, created_at, updated_at
FROM main.store_items
WHERE $prefix = '' OR namespace = $prefix OR starts_with(namespace, $prefix || '.')
ORDER BY item_id;

-- name: item_vectors
-- The vectors of the items under a namespace prefix ('' for all), by item and text.
SELECT v.item_id, v.text_no, v.vector
FROM main.store_item_vectors AS v JOIN main.store_items AS i USING (item_id)
WHERE $prefix = '' OR i.namespace = $prefix OR starts_with(i.namespace, $prefix || '.')
ORDER BY v.item_id, v.text_no;

-- name: item_postings
-- Term frequencies of the terms `$terms` in the items under a namespace prefix.
SELECT p.item_id, p.term, p.tf
FROM main.store_item_postings AS p JOIN main.store_items AS i USING (item_id)
WHERE list_contains($terms, p.term)
  AND ($prefix = '' OR i.namespace = $prefix OR starts_with(i.namespace, $prefix || '.'));

-- name: item_namespaces
-- Every namespace that holds an item.
SELECT DISTINCT namespace FROM main.store_items;

-- name: item_ids
-- `$n` fresh ids for new items.
SELECT nextval('store_item_ids') AS item_id FROM range($n);

-- name: item_insert
-- New items (registered table `new_items`).
INSERT INTO main.store_items
SELECT item_id, session_id, namespace, key, value, n_terms, now_ts, now_ts FROM new_items;

-- name: item_update
-- Replace stored items' values (registered table `new_items`); created_at stays.
UPDATE main.store_items AS s
SET value = n.value, n_terms = n.n_terms, updated_at = n.now_ts
FROM new_items AS n WHERE s.item_id = n.item_id;

-- name: item_drop_derived
-- Remove the vectors and postings of some items (registered table `wanted`).
DELETE FROM main.store_item_vectors WHERE item_id IN (SELECT item_id FROM wanted);
DELETE FROM main.store_item_postings WHERE item_id IN (SELECT item_id FROM wanted);

-- name: item_delete
-- Remove some items (registered table `wanted`; their vectors and postings go first).
DELETE FROM main.store_items WHERE item_id IN (SELECT item_id FROM wanted);

-- name: item_vectors_insert
-- Vectors of indexed texts (registered table `new_vectors`).
INSERT INTO main.store_item_vectors SELECT session_id, item_id, text_no, path, vector FROM new_vectors;

-- name: item_postings_insert
-- BM25 postings of indexed texts (registered table `new_postings`).
INSERT INTO main.store_item_postings SELECT session_id, item_id, term, tf FROM new_postings;

-- name: owner_has_items
-- Whether an owner (a session id, or '@user:ID') has stored items.
SELECT 1 FROM main.store_items WHERE session_id = $owner LIMIT 1;

-- name: owner_items
-- Every item of an owner (a session id, or '@user:ID'), in the order they were first stored.
SELECT namespace, key, value, created_at, updated_at
FROM main.store_items WHERE session_id = $owner ORDER BY item_id;
