-- Every attempt on record, and the operator's controls.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal.

-- errors: the job's failed attempts, oldest first, the last 20 (the worker
-- appends one per failed attempt, in the statement that records the
-- outcome; cancel() appends the attempt it interrupts). Each entry holds
-- attempt, started_at, finished_at, worker, error and, when the executor
-- recorded one, result. result: what the attempt that succeeded recorded.
-- Both are NULL until there is something to hold. Adding columns without
-- a default rewrites nothing.
ALTER TABLE {{.schema}}.jobs
    ADD COLUMN IF NOT EXISTS errors jsonb,
    ADD COLUMN IF NOT EXISTS result jsonb;

COMMENT ON COLUMN {{.schema}}.jobs.errors IS
    'the failed attempts, oldest first, at most the last 20: attempt, started_at, finished_at, worker, error, result';
COMMENT ON COLUMN {{.schema}}.jobs.result IS
    'what the executor recorded on the attempt that succeeded (at most 4 KiB of JSON)';

-- queues: the queues an operator has paused. A claim reads its queue's row
-- (by primary key) and claims nothing while paused_at is set; jobs are
-- still accepted. A queue without a row is active.
CREATE TABLE IF NOT EXISTS {{.schema}}.queues (
    name       text        PRIMARY KEY CONSTRAINT queues_name_check CHECK (char_length(name) BETWEEN 1 AND 128),
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- pause_queue pauses queue: from the next claim on, no worker claims its
-- jobs; jobs already running finish. It reports whether the queue was
-- active before.
CREATE OR REPLACE FUNCTION {{.schema}}.pause_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was_paused timestamptz;
BEGIN
    SELECT q.paused_at INTO was_paused FROM {{.schema}}.queues q WHERE q.name = pause_queue.queue FOR UPDATE;
    IF was_paused IS NOT NULL THEN
        RETURN false;
    END IF;
    INSERT INTO {{.schema}}.queues AS q (name, paused_at) VALUES (pause_queue.queue, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = now(), updated_at = now();
    RETURN true;
END
$$;

-- resume_queue makes queue active again and wakes its workers, which
-- claim its due jobs at once. It reports whether the queue was paused.
CREATE OR REPLACE FUNCTION {{.schema}}.resume_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE {{.schema}}.queues q SET paused_at = NULL, updated_at = now()
    WHERE q.name = resume_queue.queue AND q.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.pg_notify({{.schema_literal}}, resume_queue.queue);
    RETURN true;
END
$$;

-- cancel makes the pending and running jobs among ids cancelled, with
-- their rows locked in id order, and returns each id found with its status
-- before and whether it was cancelled. A running job's attempt goes into
-- its errors, and its worker is told on the channel pgdispatch.control, at
-- most 300 ids a notification (a payload must be under 8000 bytes: 300
-- ids of 20 characters and a schema name of 63 bytes, escaped, fit): the
-- worker cancels the executor's context and drops its outcome.
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
BEGIN
    WITH l AS (
        SELECT j.id, j.status FROM {{.schema}}.jobs j WHERE j.id = ANY(cancel.ids) ORDER BY j.id FOR UPDATE
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
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.status ORDER BY l.id), array_agg(u.id IS NOT NULL ORDER BY l.id)
    INTO found_ids, found_statuses, changed
    FROM l LEFT JOIN u ON u.id = l.id;

    SELECT array_agg(f.id ORDER BY f.id) INTO running
    FROM unnest(found_ids, found_statuses, changed) AS f(id, status, changed)
    WHERE f.status = 'running' AND f.changed;
    FOR i IN 0 .. (coalesce(cardinality(running), 0) - 1) / 300 LOOP
        EXIT WHEN running IS NULL;
        PERFORM pg_catalog.pg_notify('pgdispatch.control',
            jsonb_build_object('schema', {{.schema_literal}}, 'cancel', to_jsonb(running[i * 300 + 1 : (i + 1) * 300]))::text);
    END LOOP;

    RETURN QUERY SELECT f.id, f.status, f.changed FROM unnest(found_ids, found_statuses, changed) AS f(id, status, changed);
END
$$;

-- snooze makes a pending job due after delay (from now), without spending
-- an attempt. It reports whether the job was pending.
CREATE OR REPLACE FUNCTION {{.schema}}.snooze(id bigint, delay interval) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF delay IS NULL OR delay < interval '0' THEN
        RAISE EXCEPTION 'snooze: the delay must be zero or more, not %', delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE {{.schema}}.jobs j SET run_at = now() + snooze.delay, updated_at = now()
    WHERE j.id = snooze.id AND j.status = 'pending';
    RETURN FOUND;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.pause_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.resume_queue(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.cancel(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.snooze(bigint, interval) FROM PUBLIC;
