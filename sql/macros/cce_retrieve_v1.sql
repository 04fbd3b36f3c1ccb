-- cce_retrieve_v1
-- Purpose: hybrid retrieval over one session's stored turns. Dense score = the best of the
--   message vector and its sentence vectors (cosine), plus a small recency boost; fused by
--   reciprocal rank with BM25 over the question's distinctive terms (names, numbers, codes
--   weigh double).
-- Parameters:
--   sid VARCHAR                 session id
--   query VARCHAR               the question (embedded with cce_embed_query)
--   k INTEGER := 40             rows returned
--   since VARCHAR := NULL       ISO-8601 time; only turns at or after it
--   until VARCHAR := NULL       ISO-8601 time; only turns at or before it
--   last_turns INTEGER := NULL  only the session's last N turns
--   before_turn INTEGER := NULL only turns numbered below this (later ones are shown verbatim)
--   recency_weight DOUBLE := 0.05, rrf_k INTEGER := 60
-- Returns: turn_no, note_id, role, speaker, ts, dense, best_sentence, bm25, recency, fused, rank
CREATE OR REPLACE TEMP MACRO cce_retrieve_v1(sid, query, k := 40, since := NULL, until := NULL,
    last_turns := NULL, before_turn := NULL, recency_weight := 0.05, rrf_k := 60) AS TABLE
WITH q AS MATERIALIZED (
    SELECT cce_embed_query(query) AS qv, cce_query_terms(query) AS qt
),
sess AS (SELECT next_turn FROM main.sessions WHERE session_id = sid),
cand AS MATERIALIZED (
    SELECT t.turn_no, t.note_id, t.role, t.speaker, t.ts, t.n_terms
    FROM main.turns AS t, sess
    WHERE t.session_id = sid
      AND (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
      AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP))
      AND (last_turns IS NULL OR t.turn_no >= sess.next_turn - last_turns)
      AND (before_turn IS NULL OR t.turn_no < before_turn)
),
mdense AS (
    SELECT m.turn_no,
        array_inner_product(CAST(m.vector AS FLOAT[@DIM@]), q.qv) / 127.0 AS d
    FROM main.message_vectors AS m, q
    WHERE m.session_id = sid
),
sdense AS (
    SELECT turn_no, max(d) AS d, arg_max(sent_no, d) AS best_sentence
    FROM (
        SELECT s.turn_no, s.sent_no,
            array_inner_product(CAST(s.vector AS FLOAT[@DIM@]), q.qv) / 127.0 AS d
        FROM main.sentence_vectors AS s, q
        WHERE s.session_id = sid
    )
    GROUP BY turn_no
),
qterms AS (SELECT unnest(q.qt, recursive := true) FROM q),
stats AS (
    SELECT count(*) AS n_docs, avg(n_terms) AS avgdl FROM main.turns WHERE session_id = sid
),
df AS (
    SELECT p.term, count(*) AS df
    FROM main.postings AS p JOIN qterms USING (term)
    WHERE p.session_id = sid
    GROUP BY p.term
),
bm AS (
    SELECT p.turn_no,
        sum(qterms.weight * ln(1 + (stats.n_docs - df.df + 0.5) / (df.df + 0.5))
            * p.tf * 2.2 / (p.tf + 1.2 * (0.25 + 0.75 * c.n_terms / greatest(stats.avgdl, 1))))
            AS bm25
    FROM main.postings AS p
    JOIN qterms USING (term) JOIN df USING (term) JOIN cand AS c USING (turn_no), stats
    WHERE p.session_id = sid
    GROUP BY p.turn_no
),
scored AS (
    SELECT c.turn_no, c.note_id, c.role, c.speaker, c.ts,
        greatest(md.d, coalesce(sd.d, md.d)) AS dense,
        sd.best_sentence,
        coalesce(bm.bm25, 0.0) AS bm25,
        (c.turn_no + 1.0) / greatest(sess.next_turn, 1) AS recency
    FROM cand AS c
    JOIN mdense AS md USING (turn_no)
    LEFT JOIN sdense AS sd USING (turn_no)
    LEFT JOIN bm USING (turn_no), sess
),
ranked AS (
    SELECT *,
        row_number() OVER (ORDER BY dense + recency_weight * recency DESC, turn_no DESC) AS r_dense,
        row_number() OVER (ORDER BY bm25 DESC, turn_no DESC) AS r_bm25
    FROM scored
),
fused AS (
    SELECT turn_no, note_id, role, speaker, ts, dense, best_sentence, bm25, recency,
        1.0 / (rrf_k + r_dense) + CASE WHEN bm25 > 0 THEN 1.0 / (rrf_k + r_bm25) ELSE 0 END
            AS fused
    FROM ranked
)
SELECT *, row_number() OVER (ORDER BY fused DESC, turn_no DESC) AS rank
FROM fused
ORDER BY rank
LIMIT k;
