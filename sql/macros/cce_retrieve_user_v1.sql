-- cce_retrieve_user_v1
-- Purpose: the order a user context is built from (before packing): the stored turns of every
--   session of a user ranked as one conversation, as cce_duck/ranking.py specifies and
--   cce_duck.index.retrieve_across computes, every constant from sql/ranking_v1.json. The
--   user's sessions are laid end to end in time order (of their first turn), one position left
--   empty between two sessions (no turn counts as the reply to another session's question);
--   BM25 statistics, recency and the fusion are those of the whole. Scores as cce_retrieve_v2,
--   then the session prior (step 6): each listed hit's score times (1 + session_weight *
--   strength / strongest) / (1 + session_weight), a session's strength being the sum of its
--   best session_top listed fused scores.
-- Parameters:
--   uid VARCHAR                 user id
--   query VARCHAR               the question (embedded with cce_embed_query)
--   k INTEGER := 40             turns ranked by fused score before the replies are added
--   since VARCHAR := NULL       ISO-8601 time; only turns at or after it
--   until VARCHAR := NULL       ISO-8601 time; only turns at or before it
--   sid VARCHAR := NULL         the session being answered in (with before_turn)
--   before_turn INTEGER := NULL leave out sid's turns numbered from this on (shown verbatim)
--   recency_weight DOUBLE, rrf_k INTEGER  default: the ranking specification's
--   conversation BOOLEAN := true  false: the fused ranking only, k rows
-- Returns: session_id, turn_no, pos (the position in the whole), note_id, role, speaker, ts,
--   dense, best_sentence, bm25, recency, asks, n_terms, fused, score (after the session
--   prior; of the fused score without conversation), rank. An unknown user gives no rows (Engine.user_search raises instead).
CREATE OR REPLACE TEMP MACRO cce_retrieve_user_v1(uid, query, k := 40, since := NULL,
    until := NULL, sid := NULL, before_turn := NULL, recency_weight := @RECENCY_WEIGHT@,
    rrf_k := @RRF_K@, conversation := true) AS TABLE
WITH placed AS MATERIALIZED (
    -- each session of the user with turns: its first turn and its first position
    SELECT session_id, first_turn,
        CAST(coalesce(sum(last_turn - first_turn + 2) OVER (
            ORDER BY first_ts, created_at, session_id
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS BIGINT) AS start
    FROM (
        SELECT t.session_id, min(t.turn_no) AS first_turn, max(t.turn_no) AS last_turn,
            min(t.ts) AS first_ts, any_value(s.created_at) AS created_at
        FROM main.turns AS t
        JOIN main.sessions AS s ON s.session_id = t.session_id
        WHERE s.user_id = uid
        GROUP BY t.session_id
    )
),
ctx AS MATERIALIZED (
    -- one row: the whole's size and last position, the question's terms with their weights
    SELECT d.n_docs, d.avgdl, d.last_pos,
        list_transform(q.qt, x -> x.term) AS terms, list_transform(q.qt, x -> x.weight) AS weights
    FROM (SELECT cce_query_terms(query) AS qt) AS q,
        (SELECT count(*) AS n_docs,
             greatest(CAST(sum(t.n_terms) AS DOUBLE) / count(*), @BM25_MIN_AVGDL@) AS avgdl,
             max(p.start + t.turn_no - p.first_turn) AS last_pos
         FROM main.turns AS t JOIN placed AS p ON p.session_id = t.session_id) AS d
),
named AS MATERIALIZED (
    -- the speakers the question names: every term of the name is among the question's terms
    SELECT list(sp.speaker) AS named
    FROM (SELECT speaker, cce_terms(speaker) AS st
          FROM (SELECT DISTINCT t.speaker FROM main.turns AS t
                WHERE t.session_id IN (SELECT session_id FROM placed)
                  AND t.speaker IS NOT NULL AND t.speaker <> '')) AS sp, ctx
    WHERE len(sp.st) > 0 AND list_has_all(ctx.terms, sp.st)
),
parts AS (
    -- kind 0: a turn inside the window; 1: its message vector; 2: a sentence vector;
    -- 3: a posting of a question term (with the term's document frequency in the whole)
    SELECT p.start + t.turn_no - p.first_turn AS pos, 0 AS kind, t.session_id, t.turn_no,
        t.n_terms, t.role, t.speaker, t.ts, t.note_id,
        coalesce(regexp_matches(t.content, '[?？؟]'), false) AS asks,
        NULL::DOUBLE AS d, NULL::INTEGER AS sent_no,
        NULL::STRUCT(i INTEGER, tf SMALLINT, df BIGINT) AS post
    FROM main.turns AS t JOIN placed AS p ON p.session_id = t.session_id
    WHERE (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
      AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP))
      AND (sid IS NULL OR before_turn IS NULL OR t.session_id <> sid
           OR t.turn_no < before_turn)
    UNION ALL
    SELECT p.start + m.turn_no - p.first_turn, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, array_inner_product(CAST(m.vector AS DOUBLE[@DIM@]),
            CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@, NULL, NULL
    FROM main.message_vectors AS m JOIN placed AS p ON p.session_id = m.session_id
    UNION ALL
    SELECT p.start + s.turn_no - p.first_turn, 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, array_inner_product(CAST(s.vector AS DOUBLE[@DIM@]),
            CAST(cce_embed_query(query) AS DOUBLE[@DIM@])) / @VECTOR_SCALE@, s.sent_no, NULL
    FROM main.sentence_vectors AS s JOIN placed AS p ON p.session_id = s.session_id
    UNION ALL
    SELECT pos, 3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        struct_pack(i := i, tf := tf, df := count(*) OVER (PARTITION BY i))
    FROM (SELECT p.start + o.turn_no - p.first_turn AS pos, o.tf,
              list_position(ctx.terms, o.term) AS i
          FROM main.postings AS o JOIN placed AS p ON p.session_id = o.session_id, ctx
          WHERE list_position(ctx.terms, o.term) IS NOT NULL)
),
scored AS (
    SELECT g.pos, g.session_id, g.turn_no, g.note_id, g.role, g.speaker, g.ts, g.n_terms,
        g.asks, g.best_sentence,
        greatest(g.md, coalesce(g.sd, g.md)) AS dense,
        coalesce(list_sum(list_transform(g.posts, x -> ctx.weights[x.i]
            * ln(1 + (CAST(ctx.n_docs - x.df AS DOUBLE) + 0.5) / (x.df + 0.5))
            * CAST(x.tf AS DOUBLE) * (@BM25_K1@ + 1)
            / (CAST(x.tf AS DOUBLE) + @BM25_K1@ * ((1 - @BM25_B@)
               + @BM25_B@ * g.n_terms / ctx.avgdl)))), 0.0) AS bm25,
        (g.pos + 1) / (ctx.last_pos + 1) AS recency
    FROM (
        SELECT pos,
            any_value(session_id) FILTER (WHERE kind = 0) AS session_id,
            any_value(turn_no) FILTER (WHERE kind = 0) AS turn_no,
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
        GROUP BY pos
    ) AS g, ctx
    WHERE g.in_window > 0 AND g.md IS NOT NULL
),
ranked AS (
    SELECT *, row_number() OVER (ORDER BY fused DESC, pos DESC) AS frank
    FROM (
        SELECT *,
            1.0::DOUBLE / (rrf_k + row_number() OVER (
                ORDER BY dense + CAST(recency_weight AS DOUBLE) * recency DESC, pos DESC))
            + CASE WHEN bm25 > 0 THEN 1.0::DOUBLE / (rrf_k + row_number() OVER (
                ORDER BY bm25 DESC, pos DESC)) ELSE 0.0::DOUBLE END AS fused
        FROM scored
    )
),
listed AS (
    -- the best k, and with the conversation order the turn right after each of them that asks
    SELECT * EXCLUDE (after_question, prev_pos)
    FROM (
        SELECT *, lag(frank <= k AND asks) OVER (ORDER BY pos) AS after_question,
            lag(pos) OVER (ORDER BY pos) AS prev_pos
        FROM ranked
    )
    WHERE frank <= k OR (conversation AND after_question AND prev_pos = pos - 1)
),
conversed AS (
    SELECT l.*,
        CASE WHEN conversation THEN
            CASE WHEN lag(l.pos) OVER w = l.pos - 1 AND lag(l.asks) OVER w
                 THEN l.fused + @REPLY_SHARE@ * lag(l.fused) OVER w ELSE l.fused END
            * CASE WHEN len(named.named) = 1
                    AND (l.speaker IS NULL OR NOT list_contains(named.named, l.speaker))
                   THEN @OTHER_SPEAKER@ ELSE 1.0::DOUBLE END
            * (l.n_terms / (l.n_terms + @TERMS_HALF_WEIGHT@))
        END AS score
    FROM listed AS l, named
    WINDOW w AS (ORDER BY l.pos)
),
strengths AS (
    -- the session prior: a session's strength is the sum of its best listed fused scores
    SELECT session_id,
        list_sum(list_slice(list(fused ORDER BY fused DESC), 1, @SESSION_TOP@)) AS strength
    FROM conversed
    GROUP BY session_id
),
priored AS (
    SELECT c.*, coalesce(c.score, c.fused)
        * CASE WHEN m.strongest > 0 AND @SESSION_WEIGHT@ <> 0
               THEN (1 + @SESSION_WEIGHT@ * st.strength / m.strongest) / (1 + @SESSION_WEIGHT@)
               ELSE 1.0::DOUBLE END AS final
    FROM conversed AS c
    JOIN strengths AS st ON st.session_id = c.session_id,
        (SELECT max(strength) AS strongest FROM strengths) AS m
)
SELECT session_id, turn_no, pos, note_id, role, speaker, ts, dense, best_sentence, bm25,
    recency, asks, n_terms, fused, final AS score,
    row_number() OVER (ORDER BY final DESC, pos DESC) AS rank
FROM priored
ORDER BY rank;
