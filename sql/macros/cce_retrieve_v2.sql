-- cce_retrieve_v2
-- Purpose: the order a context is built from (before packing): one session's stored turns
--   ranked as cce_duck/ranking.py specifies, every constant from sql/ranking_v1.json. Dense
--   score = the best of the message vector and its sentence vectors, fused by reciprocal rank
--   (with a small recency boost) with BM25 over the question's terms; then the replies to the
--   questions among the best k are added and the list is ordered by conversation score (reply
--   share, the one speaker the question names, a prior on the turn's size).
-- Parameters:
--   sid VARCHAR                 session id
--   query VARCHAR               the question (embedded with cce_embed_query)
--   k INTEGER := 40             turns ranked by fused score before the replies are added
--   since VARCHAR := NULL       ISO-8601 time; only turns at or after it
--   until VARCHAR := NULL       ISO-8601 time; only turns at or before it
--   last_turns INTEGER := NULL  only the session's last N turns
--   before_turn INTEGER := NULL only turns numbered below this (later ones are shown verbatim)
--   recency_weight DOUBLE, rrf_k INTEGER  default: the ranking specification's
--   conversation BOOLEAN := true  false: the fused ranking only (Engine.search), k rows
-- Returns: turn_no, note_id, role, speaker, ts, dense, best_sentence, bm25, recency, asks,
--   n_terms, fused, score (NULL without conversation), rank
CREATE OR REPLACE TEMP MACRO cce_retrieve_v2(sid, query, k := 40, since := NULL, until := NULL,
    last_turns := NULL, before_turn := NULL, recency_weight := @RECENCY_WEIGHT@,
    rrf_k := @RRF_K@, conversation := true) AS TABLE
WITH qterms AS MATERIALIZED (
    SELECT t.term, t.weight, i
    FROM (SELECT unnest(qt) AS t, generate_subscripts(qt, 1) AS i
          FROM (SELECT cce_query_terms(query) AS qt))
),
sess AS MATERIALIZED (
    SELECT s.next_turn, count(t.turn_no) AS n_docs,
        greatest(CAST(sum(t.n_terms) AS DOUBLE) / count(t.turn_no), @BM25_MIN_AVGDL@) AS avgdl
    FROM main.sessions AS s LEFT JOIN main.turns AS t ON t.session_id = s.session_id
    WHERE s.session_id = sid
    GROUP BY s.next_turn
),
cand AS MATERIALIZED (
    SELECT t.turn_no, t.note_id, t.role, t.speaker, t.ts, t.n_terms,
        coalesce(regexp_matches(t.content, '[?？؟]'), false) AS asks,
        (t.turn_no + 1) / greatest(sess.next_turn, 1) AS recency
    FROM main.turns AS t, sess
    WHERE t.session_id = sid
      AND (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
      AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP))
      AND (last_turns IS NULL OR t.turn_no >= sess.next_turn - last_turns)
      AND (before_turn IS NULL OR t.turn_no < before_turn)
),
mdense AS MATERIALIZED (
    SELECT m.turn_no,
        array_inner_product(CAST(m.vector AS DOUBLE[@DIM@]),
            CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@ AS d
    FROM main.message_vectors AS m
    WHERE m.session_id = sid AND m.turn_no IN (SELECT turn_no FROM cand)
),
sdense AS MATERIALIZED (
    SELECT turn_no, max(d) AS d, arg_max(sent_no, struct_pack(d := d, first := -sent_no))
        AS best_sentence
    FROM (
        SELECT s.turn_no, s.sent_no,
            array_inner_product(CAST(s.vector AS DOUBLE[@DIM@]),
                CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@ AS d
        FROM main.sentence_vectors AS s
        WHERE s.session_id = sid AND s.turn_no IN (SELECT turn_no FROM cand)
    )
    GROUP BY turn_no
),
df AS MATERIALIZED (
    SELECT p.term, count(*) AS df
    FROM main.postings AS p
    WHERE p.session_id = sid AND p.term IN (SELECT term FROM qterms)
    GROUP BY p.term
),
bm AS MATERIALIZED (
    SELECT turn_no, list_sum(list(part ORDER BY i)) AS bm25
    FROM (
        SELECT p.turn_no, qterms.i,
            qterms.weight * ln(1 + (CAST(sess.n_docs - df.df AS DOUBLE) + 0.5) / (df.df + 0.5))
                * CAST(p.tf AS DOUBLE) * (@BM25_K1@ + 1)
                / (CAST(p.tf AS DOUBLE) + @BM25_K1@ * ((1 - @BM25_B@)
                   + @BM25_B@ * t.n_terms / sess.avgdl)) AS part
        FROM main.postings AS p
        JOIN qterms USING (term) JOIN df USING (term)
        JOIN main.turns AS t ON t.session_id = p.session_id AND t.turn_no = p.turn_no, sess
        WHERE p.session_id = sid AND p.turn_no IN (SELECT turn_no FROM cand)
    )
    GROUP BY turn_no
),
scored AS MATERIALIZED (
    SELECT c.*, greatest(md.d, coalesce(sd.d, md.d)) AS dense, sd.best_sentence,
        coalesce(bm.bm25, 0.0) AS bm25
    FROM cand AS c
    JOIN mdense AS md USING (turn_no)
    LEFT JOIN sdense AS sd USING (turn_no)
    LEFT JOIN bm USING (turn_no)
),
fused AS MATERIALIZED (
    SELECT *, row_number() OVER (ORDER BY fused DESC, turn_no DESC) AS frank
    FROM (
        SELECT *,
            1.0::DOUBLE / (rrf_k + row_number() OVER (
                ORDER BY dense + CAST(recency_weight AS DOUBLE) * recency DESC, turn_no DESC))
            + CASE WHEN bm25 > 0 THEN 1.0::DOUBLE / (rrf_k + row_number() OVER (
                ORDER BY bm25 DESC, turn_no DESC)) ELSE 0.0::DOUBLE END AS fused
        FROM scored
    )
),
listed AS MATERIALIZED (
    SELECT f.* FROM fused AS f
    WHERE f.frank <= k OR (conversation AND EXISTS (
        SELECT 1 FROM fused AS h WHERE h.frank <= k AND h.asks AND h.turn_no = f.turn_no - 1))
),
named AS MATERIALIZED (
    SELECT speaker
    FROM (SELECT speaker, cce_terms(speaker) AS st
          FROM (SELECT DISTINCT speaker FROM main.turns
                WHERE session_id = sid AND speaker IS NOT NULL AND speaker <> ''))
    WHERE len(st) > 0 AND list_has_all((SELECT list(term) FROM qterms), st)
),
conversed AS (
    SELECT l.*,
        CASE WHEN conversation THEN
            CASE WHEN p.asks THEN l.fused + @REPLY_SHARE@ * p.fused ELSE l.fused END
            * CASE WHEN (SELECT count(*) FROM named) = 1
                    AND (l.speaker IS NULL OR l.speaker NOT IN (SELECT speaker FROM named))
                   THEN @OTHER_SPEAKER@ ELSE 1.0::DOUBLE END
            * (l.n_terms / (l.n_terms + @TERMS_HALF_WEIGHT@))
        END AS score
    FROM listed AS l LEFT JOIN listed AS p ON p.turn_no = l.turn_no - 1
)
SELECT turn_no, note_id, role, speaker, ts, dense, best_sentence, bm25, recency, asks, n_terms,
    fused, score,
    row_number() OVER (ORDER BY CASE WHEN conversation THEN score ELSE fused END DESC,
                       turn_no DESC) AS rank
FROM conversed
ORDER BY rank;
