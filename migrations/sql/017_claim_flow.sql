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
-- The jobs without a key have no limit; they are looked for among the
-- queue's first 1000 due jobs.
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
-- It returns the jobs claimed, one row each, or one row with a NULL id,
-- every row with the claim's own columns: next_in (seconds until the
-- earliest future run_at, or until a rate-limited key's next start, when
-- it claimed fewer than asked), stranded (it skipped a key or a job
-- another transaction held), paused, claimed_at (now()), took (the server's
-- seconds), limited (false: the queue has no limits any more, and the
-- claimer's own statement claims it), held (due jobs wait for a key's
-- running jobs: a job of this worker that ends may let them start), and
-- cursor_key (where the next claim starts: the key of the last job taken,
-- NULL for the jobs without a key, or after_key when it took none).
CREATE OR REPLACE FUNCTION {{.schema}}.claim_flow(
    claim_queue          text,
    claim_limit          integer,
    claim_worker         text,
    lease_seconds        float8,
    default_max_attempts integer,
    max_bytes            bigint,
    after_key            text
)
RETURNS TABLE (
    id bigint, kind text, payload jsonb, priority smallint, attempts integer, max_attempts integer,
    run_at timestamptz, created_at timestamptz, updated_at timestamptz,
    next_in float8, stranded boolean, paused boolean, claimed_at timestamptz, took float8,
    traceparent text, tracestate text, limited boolean, held boolean, cursor_key text
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    t0          timestamptz := now();
    q_paused    boolean;
    q_limited   boolean;
    -- the queue's limits: one row for every key (d_), and those of single keys
    d_conc      integer;
    d_strict    boolean;
    d_rate      integer;
    d_per       interval;
    l_keys      text[];
    l_conc      integer[];
    l_strict    boolean[];
    l_rate      integer[];
    l_per       interval[];
    li          integer;
    conc        integer;
    strict_     boolean;
    rate_       integer;
    per_        interval;
    -- the walk
    k           record;
    kr          record;
    key_locked  boolean;
    allow       integer;
    got         bigint[];
    sizes       bigint[];
    m           integer;
    win         timestamptz[];
    head_status text;
    head_run_at timestamptz;
    first_id    bigint;
    first_run   timestamptz;
    ids         bigint[] := '{}';
    taken       integer := 0;
    bytes       bigint := 0;
    is_held     boolean := false;
    is_stranded boolean := false;
    next_due    timestamptz;
    new_cursor  text := after_key;
    v_next_in   float8;
BEGIN
    SELECT coalesce(bool_or(q.paused_at IS NOT NULL), false), coalesce(bool_or(q.limited), false)
    INTO q_paused, q_limited
    FROM {{.schema}}.queues q WHERE q.name = claim_queue;
    IF q_paused OR NOT q_limited OR claim_limit < 1 THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer, NULL::integer,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            NULL::float8, NULL::boolean, q_paused, t0,
                            extract(epoch FROM clock_timestamp() - statement_timestamp())::float8,
                            NULL::text, NULL::text, q_limited, false, after_key;
        RETURN;
    END IF;

    SELECT max(f.concurrency) FILTER (WHERE f.key IS NULL), bool_or(f.strict) FILTER (WHERE f.key IS NULL),
           max(f.rate) FILTER (WHERE f.key IS NULL), max(f.per) FILTER (WHERE f.key IS NULL),
           array_agg(f.key) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.concurrency) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.strict) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.rate) FILTER (WHERE f.key IS NOT NULL),
           array_agg(f.per) FILTER (WHERE f.key IS NOT NULL)
    INTO d_conc, d_strict, d_rate, d_per, l_keys, l_conc, l_strict, l_rate, l_per
    FROM {{.schema}}.flow_limits f WHERE f.queue = claim_queue;

    FOR k IN
        WITH RECURSIVE a(key) AS (
            SELECT min(j.flow_key) FROM {{.schema}}.jobs j
            WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > coalesce(after_key, '')
          UNION ALL
            SELECT (SELECT min(j.flow_key) FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > a.key)
            FROM a WHERE a.key IS NOT NULL
        ), b(key) AS (
            SELECT min(j.flow_key) FROM {{.schema}}.jobs j
            WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > ''
              AND j.flow_key <= after_key
          UNION ALL
            SELECT (SELECT min(j.flow_key) FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > b.key
                      AND j.flow_key <= after_key)
            FROM b WHERE b.key IS NOT NULL
        )
        SELECT w.key, w.keyed FROM (
            SELECT a.key, true AS keyed, 1 AS part FROM a WHERE a.key IS NOT NULL
            UNION ALL SELECT NULL, false, 2
            UNION ALL SELECT b.key, true, 3 FROM b WHERE b.key IS NOT NULL
        ) w
    LOOP
        allow := claim_limit - taken;
        got := NULL;
        key_locked := false;
        IF NOT k.keyed THEN
            SELECT array_agg(s.id ORDER BY s.priority, s.run_at, s.id), array_agg(s.size ORDER BY s.priority, s.run_at, s.id)
            INTO got, sizes
            FROM (
                SELECT j.id, j.priority, j.run_at,
                       CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                            ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                FROM {{.schema}}.jobs j
                WHERE j.id IN (SELECT f.id FROM {{.schema}}.jobs f
                               WHERE f.queue = claim_queue AND f.status = 'pending' AND f.run_at <= t0
                               ORDER BY f.priority, f.run_at, f.id LIMIT 1000)
                  AND j.flow_key IS NULL AND j.status = 'pending'
                ORDER BY j.priority, j.run_at, j.id
                LIMIT allow
                FOR UPDATE SKIP LOCKED
            ) s;
        ELSE
            li := array_position(l_keys, k.key);
            IF li IS NOT NULL THEN
                conc := l_conc[li]; strict_ := l_strict[li]; rate_ := l_rate[li]; per_ := l_per[li];
            ELSE
                conc := d_conc; strict_ := coalesce(d_strict, false); rate_ := d_rate; per_ := d_per;
            END IF;

            IF conc IS NOT NULL OR strict_ OR rate_ IS NOT NULL THEN
                -- one claim of the key at a time: the lock is released when
                -- the claim's transaction is visible, and the statements
                -- after it read snapshots of their own
                IF NOT pg_try_advisory_xact_lock(hashtextextended(
                        {{.schema_literal}} || '/' || claim_queue || '/' || k.key, 0)) THEN
                    is_stranded := true;
                    CONTINUE;
                END IF;
                IF strict_ OR rate_ IS NOT NULL THEN
                    SELECT fk.head, fk.starts INTO kr
                    FROM {{.schema}}.flow_keys fk
                    WHERE fk.queue = claim_queue AND fk.key = k.key
                    FOR NO KEY UPDATE;
                    IF NOT FOUND THEN
                        INSERT INTO {{.schema}}.flow_keys AS fk (queue, key) VALUES (claim_queue, k.key)
                        ON CONFLICT DO NOTHING
                        RETURNING fk.head, fk.starts INTO kr;
                        IF NOT FOUND THEN
                            is_stranded := true;
                            CONTINUE;
                        END IF;
                    END IF;
                    key_locked := true;
                END IF;
                IF conc IS NOT NULL OR strict_ THEN
                    allow := least(allow, CASE WHEN strict_ THEN 1 ELSE conc END
                                          - (SELECT count(*) FROM {{.schema}}.jobs j
                                             WHERE j.queue = claim_queue AND j.flow_key = k.key AND j.status = 'running')::integer);
                END IF;
                IF rate_ IS NOT NULL THEN
                    win := ARRAY(SELECT s FROM unnest(kr.starts) s WHERE s > t0 - per_ ORDER BY s);
                    IF cardinality(win) >= rate_ THEN
                        next_due := least(next_due, win[cardinality(win) - rate_ + 1] + per_);
                    END IF;
                    allow := least(allow, rate_ - cardinality(win));
                END IF;
                IF allow < 1 THEN
                    IF (conc IS NOT NULL OR strict_) AND EXISTS (
                        SELECT FROM {{.schema}}.jobs j
                        WHERE j.queue = claim_queue AND j.flow_key = k.key AND j.status = 'pending' AND j.run_at <= t0) THEN
                        is_held := true;
                    END IF;
                    CONTINUE;
                END IF;
            END IF;

            IF strict_ THEN
                first_id := NULL;
                IF kr.head IS NOT NULL THEN
                    head_status := NULL;
                    SELECT j.status, j.run_at INTO head_status, head_run_at
                    FROM {{.schema}}.jobs j WHERE j.id = kr.head AND j.queue = claim_queue AND j.flow_key = k.key;
                    IF head_status = 'pending' THEN
                        first_id := kr.head; first_run := head_run_at;
                    ELSIF head_status = 'running' THEN
                        is_held := true;
                        CONTINUE;
                    END IF;
                END IF;
                IF first_id IS NULL THEN
                    SELECT j.id, j.run_at INTO first_id, first_run
                    FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.flow_key = k.key AND j.status = 'pending'
                    ORDER BY j.priority, j.run_at, j.id LIMIT 1;
                END IF;
                IF first_id IS NULL THEN
                    CONTINUE;
                ELSIF first_run > t0 THEN
                    next_due := least(next_due, first_run);
                    CONTINUE;
                END IF;
                SELECT ARRAY[j.id],
                       ARRAY[CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                                  ELSE pg_column_size(j.payload || '{}'::jsonb) END::bigint]
                INTO got, sizes
                FROM {{.schema}}.jobs j
                WHERE j.id = first_id AND j.status = 'pending'
                FOR UPDATE SKIP LOCKED;
                IF got IS NULL THEN
                    is_stranded := true;
                    CONTINUE;
                END IF;
            ELSE
                SELECT array_agg(s.id ORDER BY s.priority, s.run_at, s.id), array_agg(s.size ORDER BY s.priority, s.run_at, s.id)
                INTO got, sizes
                FROM (
                    SELECT j.id, j.priority, j.run_at,
                           CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                                ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                    FROM {{.schema}}.jobs j
                    WHERE j.queue = claim_queue AND j.flow_key = k.key AND j.status = 'pending' AND j.run_at <= t0
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT allow
                    FOR UPDATE SKIP LOCKED
                ) s;
            END IF;
        END IF;

        -- take the jobs got, in order, while the payloads taken so far are
        -- under max_bytes (one job at least)
        m := 0;
        FOR i IN 1 .. coalesce(cardinality(got), 0) LOOP
            EXIT WHEN taken > 0 AND bytes >= max_bytes;
            ids := ids || got[i];
            bytes := bytes + sizes[i];
            taken := taken + 1;
            m := m + 1;
        END LOOP;
        IF m > 0 THEN
            new_cursor := k.key;
            IF key_locked THEN
                UPDATE {{.schema}}.flow_keys fk
                SET head = CASE WHEN strict_ THEN got[1] ELSE fk.head END,
                    starts = CASE WHEN rate_ IS NOT NULL THEN win || array_fill(t0, ARRAY[m]) ELSE '{}' END
                WHERE fk.queue = claim_queue AND fk.key = k.key;
            END IF;
        END IF;
        EXIT WHEN taken >= claim_limit OR bytes >= max_bytes;
    END LOOP;

    IF taken < claim_limit THEN
        v_next_in := least(
            (SELECT extract(epoch FROM min(j.run_at) - t0)::float8 FROM {{.schema}}.jobs j
             WHERE j.status = 'pending' AND j.queue = claim_queue AND j.run_at > t0),
            extract(epoch FROM next_due - t0)::float8);
    END IF;

    RETURN QUERY
    WITH u AS (
        UPDATE {{.schema}}.jobs j
        SET status = 'running',
            attempts = least(j.attempts, 999999) + 1,
            max_attempts = coalesce(j.max_attempts, default_max_attempts),
            locked_by = claim_worker,
            locked_until = t0 + make_interval(secs => lease_seconds),
            updated_at = t0
        WHERE j.id = ANY(ids)
        RETURNING j.id, j.kind, j.payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
                  j.updated_at, j.traceparent, j.tracestate
    )
    SELECT u.id, u.kind, u.payload, u.priority, u.attempts, u.max_attempts, u.run_at, u.created_at, u.updated_at,
           v_next_in, is_stranded, false, t0,
           extract(epoch FROM clock_timestamp() - statement_timestamp())::float8,
           u.traceparent, u.tracestate, true, is_held, new_cursor
    FROM (SELECT 1) one LEFT JOIN u ON true;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.claim_flow(text, integer, text, float8, integer, bigint, text) FROM PUBLIC;

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
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.claim_flow(text, integer, text, float8, integer, bigint, text) TO %s',
                                  {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
