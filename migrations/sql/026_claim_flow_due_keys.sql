-- claim_flow (migration 017) walks only the keys that have a due job, and
-- looks for the jobs without a key priority by priority, as the claimer's
-- own statement claims (claimer/claim.go). {{.schema}} is the schema
-- identifier.
--
-- Its walk over the keys passed every key that had pending jobs, due or
-- not, and stopped after at most 512 of them: in a queue whose keys mostly
-- wait for later (retries in their backoff, jobs scheduled ahead), a claim
-- walked, counted and locked keys that gave nothing, and a due job behind
-- them waited for the claims that followed. Its look for the jobs without
-- a key scanned the queue in (priority, run_at, id) order, which cannot
-- end at the first job not due, and read every job waiting for later. The
-- walk's step reads a key's pending jobs in (priority, run_at, id) order
-- up to its first due one: it passes over the jobs waiting for later in
-- the index alone; a claim that finds no job of the queue due walks
-- nothing, and one that finds 16 or fewer walks their keys. A claim that
-- finds more still passes over the entries of the keys ahead between its
-- place and the due keys.
--
-- The takes of jobs by id (the jobs without a key, a strict key's head),
-- planned generic on an empty table as a worker that starts on a new
-- queue plans them, took jobs_kind_idx, whose predicate the literal
-- 'pending' proved, with the id a condition on its last column: they read
-- every pending job. They compare the status with a variable, which proves
-- no predicate.
CREATE OR REPLACE FUNCTION {{.schema}}.claim_flow(
    claim_queue          text,
    claim_limit          integer,
    claim_worker         text,
    lease_seconds        float8,
    default_max_attempts integer,
    max_bytes            bigint,
    after_key            text,
    look_unkeyed         boolean
)
RETURNS TABLE (
    id bigint, kind text, payload jsonb, priority smallint, attempts integer, max_attempts integer,
    run_at timestamptz, created_at timestamptz, updated_at timestamptz,
    next_in float8, stranded boolean, paused boolean, claimed_at timestamptz, took float8,
    traceparent text, tracestate text, limited boolean, held boolean, cursor_key text, unkeyed boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    t0          timestamptz := now();
    q_paused    boolean;
    q_limited   boolean;
    -- the queue's limits: those of every key (d_), and those of single keys
    d_conc      integer;
    d_strict    boolean;
    d_rate      integer;
    d_per       interval;
    l_keys      text[];
    l_conc      integer[];
    l_strict    boolean[];
    l_rate      integer[];
    l_per       interval[];
    -- the walk: part 1 the keys after after_key, 2 the jobs without a key,
    -- 3 the keys up to after_key; from_key the last key walked
    part        integer := 1;
    from_key    text := coalesce(after_key, '');
    want        integer;
    walk_n      integer;
    walked      text[];
    mine        text[];
    last_walked text;
    r           record;
    ids         bigint[] := '{}';
    taken       integer := 0;
    bytes       bigint := 0;
    st_keys     text[] := '{}';
    st_head     bigint[] := '{}';
    st_per      interval[] := '{}';
    is_held     boolean := false;
    is_stranded boolean := false;
    next_due    timestamptz;
    new_cursor  text := after_key;
    v_next_in   float8;
    t_rec       timestamptz;
    found_unkeyed boolean;
    look_ids    bigint[];
    due_keys    text[];     -- the keys of the due jobs, in key order, when few are due; NULL: walk
    -- 'pending', as a variable: a job looked up by id is found by the
    -- primary key. With the literal, a generic plan made on an empty table
    -- took a partial index of pending jobs (its predicate proven by the
    -- literal) and read every pending job to find one by its id.
    pending     text := 'pending';
    -- the most keys a claim walks, so that it holds a bounded number of
    -- advisory locks (the server's lock table is shared by the cluster)
    max_walk    integer := least(2 * claim_limit + 64, 512);
    n_walked    integer := 0;
    any_full    boolean;
    any_taken   boolean;
    last_any    text := after_key;
    tids        tid[] := '{}';
    room_keys   text[] := '{}';
    room_caps   integer[] := '{}';
    took_keys   text[] := '{}';
    unkeyed_n   integer;
    n_batch_nolock bigint;
    n_nolock    bigint := 0;
    lo_key      text;
    hi_key      text;
    pre         integer;
    lo_c        integer;
    hi_c        integer;
    pick        integer;
BEGIN
    SELECT coalesce(bool_or(q.paused_at IS NOT NULL), false), coalesce(bool_or(q.limited), false)
    INTO q_paused, q_limited
    FROM {{.schema}}.queues q WHERE q.name = claim_queue;
    IF q_paused OR NOT q_limited OR claim_limit < 1 THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer, NULL::integer,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            NULL::float8, NULL::boolean, q_paused, t0,
                            extract(epoch FROM clock_timestamp() - statement_timestamp())::float8,
                            NULL::text, NULL::text, q_limited, false, after_key, NULL::boolean;
        RETURN;
    END IF;

    SELECT max(f.concurrency) FILTER (WHERE f.key IS NULL), coalesce(bool_or(f.strict) FILTER (WHERE f.key IS NULL), false),
           max(f.rate) FILTER (WHERE f.key IS NULL), max(f.per) FILTER (WHERE f.key IS NULL),
           coalesce(array_agg(f.key) FILTER (WHERE f.key IS NOT NULL), '{}'),
           array_agg(f.concurrency) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.strict) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.rate) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.per) FILTER (WHERE f.key IS NOT NULL)
    INTO d_conc, d_strict, d_rate, d_per, l_keys, l_conc, l_strict, l_rate, l_per
    FROM {{.schema}}.flow_limits f WHERE f.queue = claim_queue;

    -- Nothing due in the queue (a claim woken by a job scheduled ahead, a
    -- timer early, the fallback tick): no walk, whose steps pass over the
    -- entries of every job ahead. The queue's first due job, by
    -- jobs_schedule_idx, in one descent (a scalar subquery keeps its ORDER
    -- BY, which an EXISTS drops, and with it the index that ends at the
    -- first job not due).
    IF (SELECT j.run_at FROM {{.schema}}.jobs j
        WHERE j.queue = claim_queue AND j.status = 'pending' AND j.run_at <= t0
        ORDER BY j.queue, j.run_at LIMIT 1) IS NULL THEN
        part := 4;
    ELSE
        -- With few jobs due (16 at most), their keys, read by
        -- jobs_schedule_idx (a heap fetch each), are the keys the walk
        -- takes, in key order: its steps would pass over the entries of
        -- every keyed job ahead between them.
        due_keys := ARRAY(SELECT j.flow_key FROM {{.schema}}.jobs j
                          WHERE j.queue = claim_queue AND j.status = 'pending' AND j.run_at <= t0
                          ORDER BY j.queue, j.run_at LIMIT 17);
        IF cardinality(due_keys) <= 16 THEN
            due_keys := ARRAY(SELECT DISTINCT k FROM unnest(due_keys) k WHERE k IS NOT NULL ORDER BY k);
        ELSE
            due_keys := NULL;
        END IF;
    END IF;

    LOOP
        want := claim_limit - taken;
        EXIT WHEN want < 1 OR bytes >= max_bytes OR part > 3;

        IF part = 2 AND NOT look_unkeyed THEN
            part := 3; from_key := '';
            CONTINUE;
        ELSIF part = 2 THEN
            -- the jobs without a key, among the queue's first due jobs,
            -- found priority by priority as the claimer's statement finds
            -- them (claimer/claim.go): each priority's due jobs from its
            -- first pending job, so that the jobs waiting for later are
            -- not read; past the 16th priority, the first due job of each
            -- next priority that has one
            found_unkeyed := false;
            unkeyed_n := 0;
            look_ids := ARRAY(
                WITH RECURSIVE pr(priority, run_at, id, depth) AS (
                    (SELECT p.priority, p.run_at, p.id, 1 FROM {{.schema}}.jobs p
                     WHERE p.status = 'pending' AND p.queue = claim_queue
                     ORDER BY p.priority, p.run_at, p.id LIMIT 1)
                  UNION ALL
                    SELECT n.priority, n.run_at, n.id, pr.depth + 1 FROM pr CROSS JOIN LATERAL (
                        SELECT p.priority, p.run_at, p.id FROM {{.schema}}.jobs p
                        WHERE p.status = 'pending' AND p.queue = claim_queue AND p.priority > pr.priority
                          AND p.run_at <= CASE WHEN pr.depth < 16 THEN 'infinity'::timestamptz ELSE t0 END
                        ORDER BY p.priority, p.run_at, p.id LIMIT 1) n
                )
                SELECT f.id FROM (
                    SELECT d.id, d.flow_key FROM pr CROSS JOIN LATERAL (
                        SELECT p.id, p.flow_key FROM {{.schema}}.jobs p
                        WHERE p.status = 'pending' AND p.queue = claim_queue AND p.priority = pr.priority
                          AND (p.run_at, p.id) >= (pr.run_at, pr.id) AND p.run_at <= t0
                        ORDER BY p.run_at, p.id LIMIT least(4 * want, 1000)) d
                    LIMIT least(4 * want, 1000)) f
                WHERE f.flow_key IS NULL);
            FOR r IN
                SELECT j.id, j.ctid, CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                                  ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                FROM {{.schema}}.jobs j
                WHERE j.id = ANY(look_ids)
                  AND j.status = pending
                ORDER BY j.priority, j.run_at, j.id
                LIMIT want
                FOR UPDATE SKIP LOCKED
            LOOP
                EXIT WHEN taken > 0 AND bytes >= max_bytes;
                ids := ids || r.id; tids := tids || r.ctid; bytes := bytes + r.size; taken := taken + 1;
                unkeyed_n := unkeyed_n + 1;
                new_cursor := NULL; found_unkeyed := true;
            END LOOP;
            IF unkeyed_n < want AND NOT is_stranded THEN
                -- one it found and did not take: another transaction held it
                is_stranded := EXISTS (SELECT FROM unnest(look_ids) x WHERE x <> ALL(ids));
            END IF;
            part := 3; from_key := '';
            CONTINUE;
        END IF;
        IF part = 3 AND after_key IS NULL THEN
            EXIT;
        END IF;

        -- The next keys of the part, in key order, half as many again as
        -- the claim still takes (some are at their limit), and no more than max_walk in the claim. A key
        -- at its concurrency limit in this statement's snapshot is skipped
        -- (a claim since may only have added running jobs); each other
        -- limited one is this claim's if its lock is free.
        walk_n := least(want + want / 2 + 8, max_walk - n_walked);
        IF walk_n < 1 THEN
            -- keys are left: look again soon, from the last one walked
            is_stranded := true;
            new_cursor := last_any;
            EXIT;
        END IF;
        WITH RECURSIVE a(key) AS (
            SELECT (SELECT j.flow_key FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > from_key AND j.run_at <= t0
                    ORDER BY j.queue, j.flow_key LIMIT 1)
            WHERE due_keys IS NULL
          UNION ALL
            SELECT (SELECT j.flow_key FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > a.key AND j.run_at <= t0
                    ORDER BY j.queue, j.flow_key LIMIT 1)
            FROM a WHERE a.key IS NOT NULL AND (part = 1 OR a.key <= after_key)
        ), ak AS (
            SELECT a.key FROM a WHERE due_keys IS NULL
          UNION ALL
            (SELECT d.key FROM unnest(due_keys) WITH ORDINALITY d(key, n) WHERE d.key > from_key ORDER BY d.n)
        ), w AS (
            SELECT ak.key, array_position(l_keys, ak.key) AS li FROM ak
            WHERE ak.key IS NOT NULL AND (part = 1 OR ak.key <= after_key)
            LIMIT walk_n
        ), l AS (
            SELECT w.key,
                   CASE WHEN w.li IS NULL THEN d_conc IS NOT NULL OR d_strict OR d_rate IS NOT NULL
                        ELSE l_conc[w.li] IS NOT NULL OR l_strict[w.li] OR l_rate[w.li] IS NOT NULL END AS limited,
                   CASE WHEN w.li IS NULL THEN CASE WHEN d_strict THEN 1 ELSE d_conc END
                        ELSE CASE WHEN l_strict[w.li] THEN 1 ELSE l_conc[w.li] END END AS most
            FROM w
        ), c AS MATERIALIZED (
            SELECT l.*, CASE WHEN l.most IS NOT NULL THEN
                            (SELECT count(*) FROM (SELECT FROM {{.schema}}.jobs j
                                                   WHERE j.queue = claim_queue AND j.flow_key >= l.key AND j.flow_key <= l.key
                                                     AND j.status = 'running'
                                                   ORDER BY j.queue, j.flow_key) r)
                        END AS running
            FROM l
        ), d AS MATERIALIZED (
            SELECT c.key, coalesce(c.running >= c.most, false) AS full,
                   CASE WHEN NOT c.limited THEN true
                        WHEN c.running >= c.most THEN false
                        ELSE pg_try_advisory_xact_lock(hashtextextended({{.schema_literal}} || '/' || claim_queue || '/' || c.key, 0))
                   END AS got
            FROM c
        )
        SELECT array_agg(d.key ORDER BY d.key), coalesce(array_agg(d.key ORDER BY d.key) FILTER (WHERE d.got), '{}'),
               max(d.key), coalesce(bool_or(d.full), false), coalesce(bool_or(NOT d.got AND NOT coalesce(d.full, false)), false),
               count(*) FILTER (WHERE NOT d.got AND NOT coalesce(d.full, false))
        INTO walked, mine, last_walked, any_full, any_taken, n_batch_nolock
        FROM d;
        n_nolock := n_nolock + n_batch_nolock;
        n_walked := n_walked + coalesce(cardinality(walked), 0);
        last_any := coalesce(last_walked, last_any);
        IF coalesce(cardinality(walked), 0) < walk_n THEN
            part := part + 1;
        ELSE
            from_key := last_walked;
        END IF;
        is_held := is_held OR any_full;
        is_stranded := is_stranded OR any_taken;
        CONTINUE WHEN cardinality(mine) = 0;

        -- What each key gives, read after its lock was taken: a snapshot
        -- of this statement's own sees every claim of the key before. A
        -- row for each key that gives nothing (capped), then each job of
        -- the others in key order (a row with no job for a key that has
        -- none due, or whose due ones another transaction locks).
        FOR r IN
            WITH k AS (
                SELECT u.key,
                       CASE WHEN p.li IS NULL THEN d_conc ELSE l_conc[p.li] END AS conc,
                       CASE WHEN p.li IS NULL THEN d_strict ELSE l_strict[p.li] END AS strict,
                       CASE WHEN p.li IS NULL THEN d_rate ELSE l_rate[p.li] END AS rate,
                       CASE WHEN p.li IS NULL THEN d_per ELSE l_per[p.li] END AS per
                FROM unnest(mine) u(key), LATERAL (SELECT array_position(l_keys, u.key) AS li) p
            ), f AS MATERIALIZED (
                -- each a lookup by key: the plans, generic and kept, must
                -- not depend on the statistics of the tables
                SELECT k.*,
                       CASE WHEN k.strict THEN
                           (SELECT f.head FROM {{.schema}}.flow_keys f WHERE f.queue = claim_queue AND f.key = k.key)
                       END AS head,
                       CASE WHEN k.rate IS NOT NULL THEN
                           (SELECT f.starts FROM {{.schema}}.flow_keys f WHERE f.queue = claim_queue AND f.key = k.key)
                       END AS starts,
                       CASE WHEN k.conc IS NOT NULL OR k.strict THEN
                           (SELECT count(*) FROM (SELECT FROM {{.schema}}.jobs j
                                                  WHERE j.queue = claim_queue AND j.flow_key >= k.key AND j.flow_key <= k.key
                                                    AND j.status = 'running'
                                                  ORDER BY j.queue, j.flow_key) r)::integer
                       ELSE 0 END AS running
                FROM k
            ), s AS MATERIALIZED (
                SELECT f.*,
                       CASE WHEN f.head IS NOT NULL THEN
                           (SELECT h.status FROM {{.schema}}.jobs h
                            WHERE h.id = f.head AND h.queue = claim_queue AND h.flow_key = f.key)
                       END AS head_status,
                       CASE WHEN f.rate IS NOT NULL THEN
                           ARRAY(SELECT x FROM unnest(f.starts) x WHERE x > clock_timestamp() - f.per * 1.02 ORDER BY x)
                       END AS win
                FROM f
            ), a AS MATERIALIZED (
                SELECT s.*,
                       least(least(CASE WHEN s.strict THEN 1 - s.running
                                        WHEN s.conc IS NOT NULL THEN s.conc - s.running END,
                                   s.rate - cardinality(s.win)),
                             want) AS cap
                FROM s
            ), c AS MATERIALIZED (
                SELECT a.*, CASE WHEN a.strict AND a.head_status = 'pending' THEN a.head
                                 WHEN a.strict THEN
                                     (SELECT j.id FROM {{.schema}}.jobs j
                                      WHERE j.queue = claim_queue AND j.flow_key >= a.key AND j.flow_key <= a.key
                                        AND j.status = 'pending'
                                      ORDER BY j.queue, j.flow_key, j.priority, j.run_at, j.id LIMIT 1)
                            END AS first_id
                FROM a
                WHERE a.cap IS NULL OR a.cap > 0
            )
            SELECT c.key, true AS capped, c.strict AS strict_key, c.rate IS NOT NULL AS rated, c.win,
                   NULL::bigint AS id, NULL::tid AS tid, NULL::integer AS size, c.cap, c.conc, c.rate, c.per,
                   NULL::timestamptz AS first_run
            FROM (SELECT * FROM a WHERE a.cap <= 0) c
            UNION ALL
            SELECT c.key, false, c.strict, c.rate IS NOT NULL, c.win, CASE WHEN j.run_at <= t0 THEN j.id END, j.ctid, j.size,
                   coalesce(c.cap, want), c.conc, c.rate, c.per, CASE WHEN j.run_at > t0 THEN j.run_at END
            FROM c LEFT JOIN LATERAL (
                SELECT * FROM (SELECT j.id, j.ctid, j.run_at,
                        CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                             ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                 FROM {{.schema}}.jobs j
                 WHERE NOT c.strict AND j.queue = claim_queue AND j.flow_key >= c.key AND j.flow_key <= c.key
                   AND j.status = 'pending' AND j.run_at <= t0
                 ORDER BY j.queue, j.flow_key, j.priority, j.run_at, j.id
                 LIMIT coalesce(c.cap, want)
                 FOR UPDATE SKIP LOCKED) n
                UNION ALL
                SELECT * FROM (SELECT j.id, j.ctid, j.run_at,
                        CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                             ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                 FROM {{.schema}}.jobs j
                 WHERE c.strict AND j.id = c.first_id AND j.status = pending
                 FOR UPDATE SKIP LOCKED) h
            ) j ON true
        LOOP
            IF r.capped THEN
                IF r.rated AND r.rate <= cardinality(r.win) THEN
                    next_due := least(next_due, r.win[cardinality(r.win) - r.rate + 1] + r.per * 1.02);
                ELSIF r.conc IS NOT NULL OR r.strict_key THEN
                    is_held := true;
                END IF;
                CONTINUE;
            END IF;
            IF r.first_run IS NOT NULL THEN
                next_due := least(next_due, r.first_run); -- a strict key's head, not due yet
                CONTINUE;
            END IF;
            -- the keys that had room, to look at whether due jobs were left
            -- behind, locked by another transaction
            room_keys := room_keys || r.key; room_caps := room_caps || r.cap;
            CONTINUE WHEN r.id IS NULL;
            EXIT WHEN taken >= claim_limit OR (taken > 0 AND bytes >= max_bytes);
            ids := ids || r.id; tids := tids || r.tid; bytes := bytes + r.size; taken := taken + 1;
            took_keys := took_keys || r.key;
            new_cursor := r.key;
            IF r.strict_key OR r.rated THEN
                st_keys := st_keys || r.key;
                st_head := st_head || CASE WHEN r.strict_key THEN r.id END;
                st_per := st_per || r.per;
            END IF;
        END LOOP;
    END LOOP;

    -- A key with room that gave fewer jobs than it had room for, while due
    -- jobs of it are left: another transaction held them locked, and when
    -- it ends without changing them no trigger tells: look again soon.
    IF NOT is_stranded AND cardinality(room_keys) > 0 THEN
        SELECT EXISTS (
            SELECT FROM (SELECT u.key, max(u.cap) AS cap FROM unnest(room_keys, room_caps) u(key, cap) GROUP BY u.key) rk
            WHERE (SELECT count(*) FROM unnest(took_keys) t WHERE t = rk.key) < rk.cap
              AND EXISTS (SELECT FROM {{.schema}}.jobs j
                          WHERE j.queue = claim_queue AND j.flow_key >= rk.key AND j.flow_key <= rk.key
                            AND j.status = 'pending' AND j.run_at <= t0 AND j.id <> ALL(ids)
                          ORDER BY j.queue, j.flow_key, j.priority, j.run_at, j.id))
        INTO is_stranded;
    END IF;

    -- The state of the strict and rate-limited keys taken from, one row a
    -- key, made by its first claim, written in key order under the keys'
    -- locks: the head, and the starts still in the window and this one's.
    -- when this claim takes its jobs: their updated_at, and the start a
    -- rate-limited key counts (the transaction began earlier, before the
    -- keys' locks were taken)
    t_rec := clock_timestamp();
    IF cardinality(st_keys) > 0 THEN
        INSERT INTO {{.schema}}.flow_keys AS fk (queue, key, head, starts)
        SELECT claim_queue, s.key, s.head,
               CASE WHEN s.per IS NULL THEN '{}'
                    ELSE ARRAY(SELECT x FROM unnest(o.starts) x WHERE x > t_rec - s.per * 1.02 ORDER BY x)
                         || array_fill(t_rec, ARRAY[s.n]) END
        FROM (SELECT u.key, max(u.head) AS head, max(u.per) AS per, count(*)::integer AS n
              FROM unnest(st_keys, st_head, st_per) u(key, head, per) GROUP BY u.key) s
        LEFT JOIN {{.schema}}.flow_keys o ON o.queue = claim_queue AND o.key = s.key
        ORDER BY s.key
        ON CONFLICT (queue, key) DO UPDATE SET head = coalesce(EXCLUDED.head, fk.head), starts = EXCLUDED.starts;
    END IF;

    IF taken < claim_limit THEN
        v_next_in := least(
            (SELECT extract(epoch FROM j.run_at - t0)::float8 FROM {{.schema}}.jobs j
             WHERE j.status = 'pending' AND j.queue = claim_queue AND j.run_at > t0
             ORDER BY j.queue, j.run_at LIMIT 1),
            extract(epoch FROM next_due - clock_timestamp())::float8);
    END IF;

    -- Another claim held more of the keys walked than this one took: it
    -- walks the same keys just ahead, and would again at the next claim.
    -- The next claim starts elsewhere: at a point picked at random between
    -- the queue's first and last keys, three characters past what they
    -- have in common, each between theirs (a character, not a surrogate).
    IF n_nolock > taken THEN
        SELECT (SELECT j.flow_key FROM {{.schema}}.jobs j
                WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > ''
                ORDER BY j.queue, j.flow_key LIMIT 1),
               (SELECT j.flow_key FROM {{.schema}}.jobs j
                WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > ''
                ORDER BY j.queue DESC, j.flow_key DESC LIMIT 1)
        INTO lo_key, hi_key;
        IF lo_key < hi_key AND (getdatabaseencoding() = 'UTF8' OR lo_key || hi_key ~ '^[\x01-\x7f]*$') THEN
            pre := 0;
            WHILE pre < length(lo_key) AND substr(lo_key, pre + 1, 1) = substr(hi_key, pre + 1, 1) LOOP
                pre := pre + 1;
            END LOOP;
            new_cursor := left(lo_key, pre);
            FOR i IN pre + 1 .. pre + 3 LOOP
                lo_c := ascii(substr(lo_key, i, 1));
                hi_c := ascii(substr(hi_key, i, 1));
                EXIT WHEN lo_c = 0 AND hi_c = 0;
                IF lo_c = 0 OR hi_c = 0 THEN
                    lo_c := greatest(lo_c, hi_c); hi_c := lo_c;
                END IF;
                pick := least(lo_c, hi_c) + floor(random() * (abs(hi_c - lo_c) + 1))::integer;
                IF pick BETWEEN 55296 AND 57343 THEN
                    pick := 57344;
                END IF;
                new_cursor := new_cursor || chr(pick);
            END LOOP;
        END IF;
    END IF;

    RETURN QUERY
    WITH u AS (
        UPDATE {{.schema}}.jobs j
        SET status = 'running',
            attempts = least(j.attempts, 999999) + 1,
            max_attempts = coalesce(j.max_attempts, default_max_attempts),
            locked_by = claim_worker,
            locked_until = t_rec + make_interval(secs => lease_seconds),
            updated_at = t_rec
        WHERE j.ctid = ANY(tids)
        RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
                  j.updated_at, j.traceparent, j.tracestate
    )
    SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at, u.updated_at,
           v_next_in, is_stranded, false, t0,
           extract(epoch FROM clock_timestamp() - statement_timestamp())::float8,
           u.traceparent, u.tracestate, true, is_held, new_cursor, found_unkeyed
    FROM (SELECT 1) one LEFT JOIN u ON true;
END
$$;
