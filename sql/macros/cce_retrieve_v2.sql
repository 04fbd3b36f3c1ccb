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
-- Written without hash joins (each costs a few MB of the buffer pool, which an in-memory store
-- shares with its own tables): the rows of a turn are gathered by one GROUP BY over a UNION ALL,
-- neighbours are compared with window functions.
CREATE OR REPLACE TEMP MACRO cce_retrieve_v2(sid, query, k := 40, since := NULL, until := NULL,
    last_turns := NULL, before_turn := NULL, recency_weight := @RECENCY_WEIGHT@,
    rrf_k := @RRF_K@, conversation := true) AS TABLE
WITH ctx AS MATERIALIZED (
    -- one row: the session's size and the question's terms (in order) with their weights
    SELECT s.next_turn, d.n_docs, d.avgdl,
        list_transform(q.qt, x -> x.term) AS terms, list_transform(q.qt, x -> x.weight) AS weights
    FROM main.sessions AS s,
        (SELECT cce_query_terms(query) AS qt) AS q,
        (SELECT count(*) AS n_docs,
             greatest(CAST(sum(n_terms) AS DOUBLE) / count(*), @BM25_MIN_AVGDL@) AS avgdl
         FROM main.turns WHERE session_id = sid) AS d
    WHERE s.session_id = sid
),
named AS MATERIALIZED (
    -- the speakers the question names: every term of the name is among the question's terms
    SELECT list(sp.speaker) AS named
    FROM (SELECT speaker, cce_terms(speaker) AS st
          FROM (SELECT DISTINCT speaker FROM main.turns
                WHERE session_id = sid AND speaker IS NOT NULL AND speaker <> '')) AS sp, ctx
    WHERE len(sp.st) > 0 AND list_has_all(ctx.terms, sp.st)
),
parts AS (
    -- kind 0: a turn inside the window; 1: its message vector; 2: a sentence vector;
    -- 3: a posting of a question term (with the term's document frequency)
    SELECT t.turn_no, 0 AS kind, t.n_terms, t.role, t.speaker, t.ts, t.note_id,
        coalesce(regexp_matches(t.content, '[?？؟]'), false) AS asks,
        NULL::DOUBLE AS d, NULL::INTEGER AS sent_no,
        NULL::STRUCT(i INTEGER, tf SMALLINT, df BIGINT) AS post
    FROM main.turns AS t, ctx
    WHERE t.session_id = sid
      AND (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
      AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP))
      AND (last_turns IS NULL OR t.turn_no >= ctx.next_turn - last_turns)
      AND (before_turn IS NULL OR t.turn_no < before_turn)
    UNION ALL
    SELECT m.turn_no, 1, NULL, NULL, NULL, NULL, NULL, NULL,
        array_inner_product(CAST(m.vector AS DOUBLE[@DIM@]),
            CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@, NULL, NULL
    FROM main.message_vectors AS m
    WHERE m.session_id = sid
    UNION ALL
    SELECT s.turn_no, 2, NULL, NULL, NULL, NULL, NULL, NULL,
        array_inner_product(CAST(s.vector AS DOUBLE[@DIM@]),
            CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@, s.sent_no, NULL
    FROM main.sentence_vectors AS s
    WHERE s.session_id = sid
    UNION ALL
    SELECT turn_no, 3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        struct_pack(i := i, tf := tf, df := count(*) OVER (PARTITION BY i))
    FROM (SELECT p.turn_no, p.tf, list_position(ctx.terms, p.term) AS i
          FROM main.postings AS p, ctx
          WHERE p.session_id = sid AND list_position(ctx.terms, p.term) IS NOT NULL)
),
scored AS (
    SELECT g.turn_no, g.note_id, g.role, g.speaker, g.ts, g.n_terms, g.asks, g.best_sentence,
        greatest(g.md, coalesce(g.sd, g.md)) AS dense,
        coalesce(list_sum(list_transform(g.posts, x -> ctx.weights[x.i]
            * ln(1 + (CAST(ctx.n_docs - x.df AS DOUBLE) + 0.5) / (x.df + 0.5))
            * CAST(x.tf AS DOUBLE) * (@BM25_K1@ + 1)
            / (CAST(x.tf AS DOUBLE) + @BM25_K1@ * ((1 - @BM25_B@)
               + @BM25_B@ * g.n_terms / ctx.avgdl)))), 0.0) AS bm25,
        (g.turn_no + 1) / greatest(ctx.next_turn, 1) AS recency
    FROM (
        SELECT turn_no,
            any_value(n_terms) FILTER (WHERE kind = 0) AS n_terms,
            any_value(role) FILTER (WHERE kind = 0) AS role,
            any_value(speaker) FILTER (WHERE kind = 0) AS speaker,
            any_value(ts) FILTER (WHERE kind = 0) AS ts,
            any_value(note_id) FILTER (WHERE kind = 0) AS note_id,
            any_value(asks) FILTER (WHERE kind = 0) AS asks,
            max(d) FILTER (WHERE kind = 1) AS md,
            max(d) FILTER (WHERE kind = 2) AS sd,
            arg_max(sent_no, struct_pack(d := d, first := -sent_no)) FILTER (WHERE kind = 2)
                AS best_sentence,
            list(post ORDER BY post.i) FILTER (WHERE kind = 3) AS posts,
            count(*) FILTER (WHERE kind = 0) AS in_window
        FROM parts
        GROUP BY turn_no
    ) AS g, ctx
    WHERE g.in_window > 0 AND g.md IS NOT NULL
),
ranked AS (
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
listed AS (
    -- the best k, and with the conversation order the turn right after each of them that asks
    SELECT * EXCLUDE (after_question, prev_turn)
    FROM (
        SELECT *, lag(frank <= k AND asks) OVER (ORDER BY turn_no) AS after_question,
            lag(turn_no) OVER (ORDER BY turn_no) AS prev_turn
        FROM ranked
    )
    WHERE frank <= k OR (conversation AND after_question AND prev_turn = turn_no - 1)
),
conversed AS (
    SELECT l.*,
        CASE WHEN conversation THEN
            CASE WHEN lag(l.turn_no) OVER w = l.turn_no - 1 AND lag(l.asks) OVER w
                 THEN l.fused + @REPLY_SHARE@ * lag(l.fused) OVER w ELSE l.fused END
            * CASE WHEN len(named.named) = 1
                    AND (l.speaker IS NULL OR NOT list_contains(named.named, l.speaker))
                   THEN @OTHER_SPEAKER@ ELSE 1.0::DOUBLE END
            * (l.n_terms / (l.n_terms + @TERMS_HALF_WEIGHT@))
        END AS score
    FROM listed AS l, named
    WINDOW w AS (ORDER BY l.turn_no)
)
SELECT turn_no, note_id, role, speaker, ts, dense, best_sentence, bm25, recency, asks, n_terms,
    fused, score,
    row_number() OVER (ORDER BY CASE WHEN conversation THEN score ELSE fused END DESC,
                       turn_no DESC) AS rank
FROM conversed
ORDER BY rank;
