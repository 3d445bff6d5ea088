-- The claim of a queue with flow limits (migration 016: flow_limits,
-- flow_keys, jobs.flow_key). A queue without limits is claimed by the
-- claimer's own statement (claimer/claim.go), which claims nothing while
-- queues.limited is set and says so; the claimer then calls claim_flow.
-- {{.schema}} is the schema identifier.
--
-- claim_flow takes up to claim_limit due jobs of claim_queue for
-- claim_worker, under a lease of lease_seconds, as the claimer's statement
-- does, but key by key: it walks the queue's keys that have pending jobs,
-- in key order, starting after after_key (NULL: at the first key), then
-- the jobs without a key as one more turn, then the keys up to after_key.
-- Each key gives at most what its limit allows:
--   concurrency  N less the key's running jobs;
--   strict       one job, when none of the key's is running: the head,
--                the job it last started while that is pending again (a
--                retry, or a job given back), else its first pending job
--                in (priority, run_at, id) order, if due;
--   rate         rate less the starts in flow_keys.starts within per;
--   none         every due job (the key only takes its turn).
-- The jobs without a key have no limit; they are looked for, when
-- look_unkeyed, among the queue's first due jobs, four times as many as the
-- claim still takes (at most 1000): give every job of a limited queue a
-- key. That look walks the front of jobs_claim_idx, which a drain fills
-- with dead entries; the claimer asks for it at each claim a wake-up
-- starts, and at a claim a freed slot starts only while the last look
-- found such jobs or 100 ms after it.
--
-- A rate's window is per and 2 % more: a key's starts are counted when its
-- claim takes them, and its executors start a few milliseconds later, by
-- a delay that varies; the 2 % keeps any window of per at the executors to
-- the rate while that delay varies by less than per / 50 (20 ms a second).
--
-- The claims of a limited key run one at a time: each takes the key's
-- advisory lock (pg_try_advisory_xact_lock, on a hash of the schema, queue
-- and key) before it counts the key's running jobs, and a claim that finds
-- it taken skips the key and says it was stranded. Each statement of the
-- function reads a snapshot of its own, taken after the lock, and a
-- transaction's locks are released only once its changes are visible: the
-- count sees every claim of the key before this one. A strict or
-- rate-limited key keeps its state in its flow_keys row, made by its first
-- claim and updated under the lock. Nothing here waits for another claim:
-- the advisory lock and the jobs are taken with SKIP LOCKED's rule, and a
-- flow_keys row is only ever locked by the one claim holding its key or by
-- the sweeper, which waits for no claim.
--
-- Its statements keep generic plans, made once per connection (the
-- claim's plan_cache_mode, claimer/internal/pinned), so they must find a
-- key's jobs by the key however the statistics looked when they were
-- made: a key's jobs are found by `flow_key >= key AND flow_key <= key`
-- and read in (queue, flow_key, ...) order, which only the keys' indexes
-- give (with `=`, the queue's other indexes give that order too, and on
-- statistics taken while the table was small the planner took them and
-- read every due job of the queue to find a key's), and rows by id or
-- ctid. Sorts and bitmap scans are off, to keep the plans on the keys'
-- indexes in their order, and so is JIT, which the disabled plans' costs
-- made compile every statement (hundreds of milliseconds).
--
-- The jobs' updated_at, which marks the claim, is the time the claim takes
-- them (clock_timestamp() once the walk is done), not its transaction's
-- start: a rate-limited key counts its starts by it.
--
-- It returns the jobs claimed, one row each, or one row with a NULL id,
-- every row with the claim's own columns: next_in (seconds until the
-- earliest future run_at, or until a rate-limited key's next start, when
-- it claimed fewer than asked), stranded (it skipped a key or a job
-- another transaction held), paused, claimed_at (now()), took (the server's
-- seconds), limited (false: the queue has no limits any more, and the
-- claimer's own statement claims it), held (due jobs wait for a key's
-- running jobs: a job of this worker that ends may let them start), and
-- cursor_key (where the next claim starts: the key of the last job taken,
-- NULL for the jobs without a key, or after_key when it took none; but a
-- point picked at random among the keys when other claims held more of
-- the keys it walked than it took: see below) and unkeyed (it took jobs
-- without a key; NULL when it did not look).
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

    LOOP
        want := claim_limit - taken;
        EXIT WHEN want < 1 OR bytes >= max_bytes OR part > 3;

        IF part = 2 AND NOT look_unkeyed THEN
            part := 3; from_key := '';
            CONTINUE;
        ELSIF part = 2 THEN
            -- the jobs without a key, among the queue's first due jobs
            found_unkeyed := false;
            unkeyed_n := 0;
            FOR r IN
                SELECT j.id, j.ctid, CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                                  ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                FROM {{.schema}}.jobs j
                WHERE j.id = ANY(ARRAY(
                          SELECT f.id FROM (SELECT f.id, f.flow_key FROM {{.schema}}.jobs f
                                            WHERE f.queue = claim_queue AND f.status = 'pending' AND f.run_at <= t0
                                            ORDER BY f.queue, f.priority, f.run_at, f.id LIMIT least(4 * want, 1000)) f
                          WHERE f.flow_key IS NULL))
                  AND j.status = 'pending'
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
                is_stranded := EXISTS (
                    SELECT FROM (SELECT f.id, f.flow_key FROM {{.schema}}.jobs f
                                 WHERE f.queue = claim_queue AND f.status = 'pending' AND f.run_at <= t0
                                 ORDER BY f.queue, f.priority, f.run_at, f.id LIMIT least(4 * want, 1000)) f
                    WHERE f.flow_key IS NULL AND f.id <> ALL(ids));
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
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > from_key
                    ORDER BY j.queue, j.flow_key LIMIT 1)
          UNION ALL
            SELECT (SELECT j.flow_key FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > a.key
                    ORDER BY j.queue, j.flow_key LIMIT 1)
            FROM a WHERE a.key IS NOT NULL AND (part = 1 OR a.key <= after_key)
        ), w AS (
            SELECT a.key, array_position(l_keys, a.key) AS li FROM a
            WHERE a.key IS NOT NULL AND (part = 1 OR a.key <= after_key)
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
                 WHERE c.strict AND j.id = c.first_id AND j.status = 'pending'
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

-- flow_ended tells the workers that sleep on each limited queue of queues
-- (a notification on the schema's channel, as a writer's insert sends, only
-- while one sleeps: the sleep key, migration 007) that a job of it stopped
-- running, which may let the next job of its key start. The completer of a
-- limited queue calls it after its outcomes; the sweeper for the jobs it
-- kills; cancel() for the running jobs it cancels. A trigger on the jobs
-- table did this at every claim's and outcome's row, for every queue.
CREATE OR REPLACE FUNCTION {{.schema}}.flow_ended(queues text[]) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_notify({{.schema_literal}}, q.name)
    FROM {{.schema}}.queues q
    WHERE q.name = ANY(flow_ended.queues) AND q.limited
      AND NOT pg_catalog.pg_try_advisory_xact_lock_shared({{.sleep_key}}, pg_catalog.hashtext(q.name))
$$;

-- cancel() is migration 010's, and tells the limited queues of the running
-- jobs it cancels (flow_ended).
CREATE OR REPLACE FUNCTION {{.schema}}.cancel(VARIADIC ids bigint[])
RETURNS TABLE (id bigint, previous_status text, cancelled boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    found_ids      bigint[];
    found_statuses text[];
    changed        boolean[];
    running        bigint[];
    running_queues text[];
BEGIN
    WITH l AS (
        SELECT j.id, j.status, j.queue FROM {{.schema}}.jobs j WHERE j.id = ANY(cancel.ids) ORDER BY j.id FOR UPDATE
    ), u AS (
        UPDATE {{.schema}}.jobs j
        SET status = 'cancelled',
            errors = CASE WHEN l.status = 'running' THEN
                         jsonb_path_query_array(coalesce(j.errors, '[]'), '$[last - 18 to last]')
                         || jsonb_build_object('attempt', j.attempts, 'started_at', j.updated_at,
                                               'finished_at', now(), 'worker', j.locked_by,
                                               'error', 'cancelled by ' || session_user)
                     ELSE j.errors END,
            finished_at = now(), locked_by = NULL, locked_until = NULL, updated_at = now()
        FROM l WHERE j.id = l.id AND l.status IN ('pending', 'running')
        RETURNING j.id
    )
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.status ORDER BY l.id), array_agg(u.id IS NOT NULL ORDER BY l.id),
           array_agg(DISTINCT l.queue) FILTER (WHERE l.status = 'running' AND u.id IS NOT NULL)
    INTO found_ids, found_statuses, changed, running_queues
    FROM l LEFT JOIN u ON u.id = l.id;

    SELECT array_agg(f.id ORDER BY f.id) INTO running
    FROM unnest(found_ids, found_statuses, changed) AS f(id, status, changed)
    WHERE f.status = 'running' AND f.changed;
    FOR i IN 0 .. (coalesce(cardinality(running), 0) - 1) / 300 LOOP
        EXIT WHEN running IS NULL;
        PERFORM pg_catalog.pg_notify('pgdispatch.control',
            jsonb_build_object('schema', {{.schema_literal}}, 'cancel', to_jsonb(running[i * 300 + 1 : (i + 1) * 300]))::text);
    END LOOP;
    IF running_queues IS NOT NULL THEN
        PERFORM {{.schema}}.flow_ended(running_queues);
    END IF;

    RETURN QUERY SELECT f.id, f.status, f.changed FROM unnest(found_ids, found_statuses, changed) AS f(id, status, changed);
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.claim_flow(text, integer, text, float8, integer, bigint, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.flow_ended(text[]) FROM PUBLIC;

-- The workers' roles, those that may delete jobs (docs/roles.sql), call it.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
             pg_catalog.aclexplode(c.relacl) a
        WHERE n.nspname = {{.schema_literal}} AND c.relname = 'jobs' AND a.privilege_type = 'DELETE'
          AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.claim_flow(text, integer, text, float8, integer, bigint, text, boolean), '
                                  '%I.flow_ended(text[]) TO %s', {{.schema_literal}}, {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- The operators' roles, those that may call pause_queue() (docs/roles.sql),
-- call flow_ended through cancel().
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
             pg_catalog.aclexplode(p.proacl) a
        WHERE n.nspname = {{.schema_literal}} AND p.proname = 'pause_queue' AND a.privilege_type = 'EXECUTE'
          AND a.grantee <> p.proowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.flow_ended(text[]) TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
