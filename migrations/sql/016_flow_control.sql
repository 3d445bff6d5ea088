-- Flow control by key (docs/operations.md, "Flow control"): a job's flow
-- key, the limits an operator declares per queue and key, and the state
-- the claim keeps per key. {{.schema}} is the schema identifier and
-- {{.schema_literal}} its name as a string literal.

-- flow_key: what the job's flow is limited by, such as the customer, the
-- tenant or the receiving host. NULL: none. A column added with its
-- constraint, NULL in every row, is checked by a scan of the table, without
-- a rewrite. The column may have been added ahead, to build the indexes
-- below first (see there): its constraint is then added here.
ALTER TABLE {{.schema}}.jobs
    ADD COLUMN IF NOT EXISTS flow_key text CONSTRAINT jobs_flow_key_check CHECK (char_length(flow_key) BETWEEN 1 AND 256);
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint
                   WHERE conrelid = pg_catalog.to_regclass(pg_catalog.quote_ident({{.schema_literal}}) || '.jobs')
                     AND conname = 'jobs_flow_key_check') THEN
        ALTER TABLE {{.schema}}.jobs
            ADD CONSTRAINT jobs_flow_key_check CHECK (char_length(flow_key) BETWEEN 1 AND 256);
    END IF;
END $$;

COMMENT ON COLUMN {{.schema}}.jobs.flow_key IS
    'the key the flow limits of the job''s queue apply to (flow_limits); NULL: none, the job takes its turn with the other jobs without a key';

-- The pending jobs of a key in claim order, and the running jobs of a key,
-- for the claim of a limited queue. Jobs without a key are in neither.
--
-- Building them reads the table and holds off writers and claims (a SHARE
-- lock) until the migration commits (docs/operations.md, "Installing the
-- schema"). On a large table, build them first without holding them off,
-- after adding the column (a change of the catalog alone), and the
-- migration keeps them:
--   ALTER TABLE pgdispatch.jobs ADD COLUMN IF NOT EXISTS flow_key text;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_flow_pending_idx
--       ON pgdispatch.jobs (queue, flow_key, priority, run_at, id)
--       WHERE status = 'pending' AND flow_key IS NOT NULL;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_flow_running_idx
--       ON pgdispatch.jobs (queue, flow_key)
--       WHERE status = 'running' AND flow_key IS NOT NULL;
-- A concurrent build that failed leaves the index invalid: it is built
-- again here.
DO $$
DECLARE
    idx text;
BEGIN
    FOREACH idx IN ARRAY ARRAY['jobs_flow_pending_idx', 'jobs_flow_running_idx'] LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_index
                   WHERE indexrelid = pg_catalog.to_regclass(pg_catalog.quote_ident({{.schema_literal}}) || '.' || idx)
                     AND NOT indisvalid) THEN
            EXECUTE pg_catalog.format('DROP INDEX %I.%I', {{.schema_literal}}, idx);
        END IF;
    END LOOP;
END $$;

CREATE INDEX IF NOT EXISTS jobs_flow_pending_idx ON {{.schema}}.jobs (queue, flow_key, priority, run_at, id)
    WHERE status = 'pending' AND flow_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_flow_running_idx ON {{.schema}}.jobs (queue, flow_key)
    WHERE status = 'running' AND flow_key IS NOT NULL;

-- limited: true while the queue has at least one row in flow_limits. The
-- claim reads it with paused_at: a queue that is not limited claims as if
-- flow control did not exist. set_flow_limit and clear_flow_limit keep it.
ALTER TABLE {{.schema}}.queues ADD COLUMN IF NOT EXISTS limited boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN {{.schema}}.queues.limited IS
    'true while the queue has a row in flow_limits (set_flow_limit and clear_flow_limit keep it)';

-- flow_limits: the limits an operator declared, with set_flow_limit. A row
-- is for one key of a queue, or (key NULL) for every key of the queue. A
-- row for an exact key overrides the queue-wide row for that key, wholly:
-- the two are not merged. Each limit is held across every worker:
--   concurrency  at most this many jobs of a key running at once (NULL: no
--                limit);
--   strict       a key's jobs start one at a time, in (priority, run_at,
--                id) order: a job starts only once every job of the key
--                ahead of it is done, dead or cancelled;
--   rate, per    at most rate starts of a key in any window of length per
--                (NULL: no limit).
-- A row with none of them still makes the queue limited: its keys then
-- only take turns (fair shares).
CREATE TABLE IF NOT EXISTS {{.schema}}.flow_limits (
    queue       text        NOT NULL CONSTRAINT flow_limits_queue_check CHECK (char_length(queue) BETWEEN 1 AND 128),
    key         text        CONSTRAINT flow_limits_key_check CHECK (char_length(key) BETWEEN 1 AND 256),
    concurrency integer     CONSTRAINT flow_limits_concurrency_check CHECK (concurrency BETWEEN 1 AND 100000),
    strict      boolean     NOT NULL DEFAULT false,
    rate        integer     CONSTRAINT flow_limits_rate_check CHECK (rate BETWEEN 1 AND 10000),
    per         interval    CONSTRAINT flow_limits_per_check CHECK (per > interval '0' AND per <= interval '1 day'),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT flow_limits_rate_per_check CHECK ((rate IS NULL) = (per IS NULL))
);

CREATE UNIQUE INDEX IF NOT EXISTS flow_limits_queue_key_idx ON {{.schema}}.flow_limits (queue, coalesce(key, ''));

COMMENT ON TABLE {{.schema}}.flow_limits IS
    'flow limits by queue and key (key NULL: every key of the queue; an exact key''s row overrides it); declare with set_flow_limit, remove with clear_flow_limit';

-- flow_keys: the claim's state of each strict or rate-limited key of a
-- limited queue that has, or recently had, jobs, written by the claim of
-- the key (claim_flow, migration 017) under the key's advisory lock.
--   head    the id of the job a strict key last started;
--   starts  the start times of the key's jobs within its rate window,
--           oldest first.
-- The sweeper deletes the rows no longer needed: a key with no pending or
-- running job whose newest start is older than the largest per of its
-- queue's limits, or that has no start.
CREATE TABLE IF NOT EXISTS {{.schema}}.flow_keys (
    queue  text          NOT NULL,
    key    text          NOT NULL,
    head   bigint,
    starts timestamptz[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (queue, key)
);

COMMENT ON TABLE {{.schema}}.flow_keys IS
    'the claim''s state per key of a limited queue: head (the job a strict key last started) and starts (start times in the rate window, oldest first)';
COMMENT ON COLUMN {{.schema}}.flow_keys.head IS
    'the id of the job the strict key last started';
COMMENT ON COLUMN {{.schema}}.flow_keys.starts IS
    'the start times of the key''s jobs within its rate window, oldest first';

-- set_flow_limit declares the limits of key in queue (key NULL: every key
-- of the queue), replacing the ones declared before for the same queue and
-- key, and wakes the queue's workers, which claim at once under the new
-- rule. It locks the queue's row first, as clear_flow_limit does, so that
-- the two keep queues.limited true exactly while the queue has a limit.
CREATE OR REPLACE FUNCTION {{.schema}}.set_flow_limit(
    queue       text,
    key         text     DEFAULT NULL,
    concurrency integer  DEFAULT NULL,
    strict      boolean  DEFAULT false,
    rate        integer  DEFAULT NULL,
    per         interval DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF set_flow_limit.queue IS NULL OR char_length(set_flow_limit.queue) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'set_flow_limit: the queue must be a name of 1 to 128 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF char_length(set_flow_limit.key) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'set_flow_limit: the key must be of 1 to 256 characters, or NULL for every key of the queue'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.concurrency NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'set_flow_limit: the concurrency must be from 1 to 100000, or NULL for none, not %', set_flow_limit.concurrency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (set_flow_limit.rate IS NULL) <> (set_flow_limit.per IS NULL) THEN
        RAISE EXCEPTION 'set_flow_limit: a rate needs its interval (per), and an interval its rate'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.rate NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'set_flow_limit: the rate must be from 1 to 10000 starts, not %', set_flow_limit.rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF set_flow_limit.per <= interval '0' OR set_flow_limit.per > interval '1 day' THEN
        RAISE EXCEPTION 'set_flow_limit: the rate''s interval (per) must be more than 0 and at most 1 day, not %', set_flow_limit.per
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO {{.schema}}.queues AS q (name, limited) VALUES (set_flow_limit.queue, true)
    ON CONFLICT (name) DO UPDATE SET limited = true, updated_at = now();
    INSERT INTO {{.schema}}.flow_limits AS l (queue, key, concurrency, strict, rate, per)
    VALUES (set_flow_limit.queue, set_flow_limit.key, set_flow_limit.concurrency,
            coalesce(set_flow_limit.strict, false), set_flow_limit.rate, set_flow_limit.per)
    ON CONFLICT (queue, coalesce(key, ''))
    DO UPDATE SET concurrency = EXCLUDED.concurrency, strict = EXCLUDED.strict, rate = EXCLUDED.rate,
                  per = EXCLUDED.per, updated_at = now();
    PERFORM pg_catalog.pg_notify({{.schema_literal}}, set_flow_limit.queue);
END
$$;

-- clear_flow_limit removes the limits of key in queue (key NULL: the row
-- for every key of the queue; the rows of exact keys stay), and reports
-- whether there was one. A queue left with no limit is no longer limited.
-- Its workers are woken: jobs the limit held back may start now.
CREATE OR REPLACE FUNCTION {{.schema}}.clear_flow_limit(queue text, key text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    removed boolean;
BEGIN
    PERFORM FROM {{.schema}}.queues q WHERE q.name = clear_flow_limit.queue FOR UPDATE;
    DELETE FROM {{.schema}}.flow_limits l
    WHERE l.queue = clear_flow_limit.queue AND coalesce(l.key, '') = coalesce(clear_flow_limit.key, '');
    removed := FOUND;
    IF NOT EXISTS (SELECT FROM {{.schema}}.flow_limits l WHERE l.queue = clear_flow_limit.queue) THEN
        UPDATE {{.schema}}.queues q SET limited = false, updated_at = now()
        WHERE q.name = clear_flow_limit.queue AND q.limited;
    END IF;
    IF removed THEN
        PERFORM pg_catalog.pg_notify({{.schema_literal}}, clear_flow_limit.queue);
    END IF;
    RETURN removed;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.set_flow_limit(text, text, integer, boolean, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.clear_flow_limit(text, text) FROM PUBLIC;

-- The roles of docs/roles.sql keep working without running it again: a
-- role that may pause queues (the operator) may declare limits and read
-- the keys' state; a role that may delete jobs (the worker) reads the
-- limits and keeps the keys' state.
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
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.set_flow_limit(text, text, integer, boolean, integer, interval), '
                                  '%I.clear_flow_limit(text, text) TO %s',
                                  {{.schema_literal}}, {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.flow_limits TO %s', {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.flow_keys TO %s', {{.schema_literal}}, grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
             pg_catalog.aclexplode(c.relacl) a
        WHERE n.nspname = {{.schema_literal}} AND c.relname = 'jobs' AND a.privilege_type = 'DELETE'
          AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.flow_limits TO %s', {{.schema_literal}}, grantee);
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.flow_keys TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- enqueue() and enqueue_checked() take the flow key as an optional
-- argument. A function's arguments are its identity, so the old ones are
-- dropped and the new ones granted to the roles that could execute the old.
CREATE TEMPORARY TABLE pgdispatch_enqueue_grantees ON COMMIT DROP AS
SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
     pg_catalog.aclexplode(p.proacl) a
WHERE n.nspname = {{.schema_literal}} AND p.proname IN ('enqueue', 'enqueue_checked') AND a.privilege_type = 'EXECUTE'
  AND a.grantee <> p.proowner;

DROP FUNCTION IF EXISTS {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text);
DROP FUNCTION IF EXISTS {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text);

-- enqueue_checked is migration 014's, with the flow key, which a job
-- holding the dedup key is compared on too.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_checked(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    tracestate   text        DEFAULT NULL,
    flow_key     text        DEFAULT NULL,
    OUT id       bigint,
    OUT created  boolean,
    OUT conflict boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgdispatch.firing = 'off'
AS $$
#variable_conflict use_column
DECLARE
    want_payload  jsonb       := coalesce(enqueue_checked.payload, '{}');
    want_queue    text        := coalesce(enqueue_checked.queue, 'default');
    want_run_at   timestamptz := coalesce(enqueue_checked.run_at, now());
    want_priority smallint    := coalesce(enqueue_checked.priority, 0);
    caller        oid;
    holder_by     oid;
    differs       text;
BEGIN
    LOOP
        INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts,
                                           traceparent, tracestate, flow_key)
        VALUES (enqueue_checked.kind, want_payload, want_queue, want_run_at, want_priority,
                enqueue_checked.dedup_key, enqueue_checked.max_attempts,
                enqueue_checked.traceparent, enqueue_checked.tracestate, enqueue_checked.flow_key)
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING j.id INTO id;
        IF id IS NOT NULL THEN
            created := true;
            conflict := false;
            RETURN;
        END IF;

        caller := to_regrole(quote_ident(session_user))::oid;
        SELECT j.id, j.created_by,
               concat_ws(', ',
                   CASE WHEN j.kind IS DISTINCT FROM enqueue_checked.kind THEN 'kind' END,
                   CASE WHEN j.queue IS DISTINCT FROM want_queue THEN 'queue' END,
                   CASE WHEN j.payload IS DISTINCT FROM want_payload THEN 'payload' END,
                   CASE WHEN j.priority IS DISTINCT FROM want_priority THEN 'priority' END,
                   CASE WHEN enqueue_checked.max_attempts IS NOT NULL
                             AND j.max_attempts IS DISTINCT FROM enqueue_checked.max_attempts THEN 'max_attempts' END,
                   CASE WHEN j.flow_key IS DISTINCT FROM enqueue_checked.flow_key THEN 'flow_key' END,
                   CASE WHEN j.attempts = 0 AND j.run_at > want_run_at THEN 'a later run_at' END)
        INTO id, holder_by, differs
        FROM {{.schema}}.jobs j
        WHERE j.dedup_key = enqueue_checked.dedup_key;
        IF id IS NOT NULL THEN
            created := false;
            IF holder_by = caller OR has_table_privilege(session_user, format('%I.jobs', {{.schema_literal}}), 'SELECT') THEN
                conflict := differs <> '';
                IF conflict THEN
                    RAISE NOTICE 'pgdispatch: dedup_key % is held by job %, which differs from the job asked for (%); no job was created',
                        enqueue_checked.dedup_key, id, differs
                        USING HINT = 'Another writer may have taken the key first. Look at that job: pgdispatch jobs show '
                                     || id || '.';
                END IF;
            ELSE
                conflict := true;
                RAISE NOTICE 'pgdispatch: dedup_key % is held by job %, which another role created; no job was created',
                    enqueue_checked.dedup_key, id
                    USING HINT = 'Another writer may have taken the key first. A role that may read pgdispatch''s jobs can look at it: pgdispatch jobs show '
                                 || id || '.';
            END IF;
            RETURN;
        END IF;
        -- The holder of the key was deleted between the two statements: try again.
    END LOOP;
END
$$;

-- enqueue is migration 014's, with the flow key.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    tracestate   text        DEFAULT NULL,
    flow_key     text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgdispatch.firing = 'off'
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts,
                                       traceparent, tracestate, flow_key)
    VALUES (enqueue.kind, coalesce(enqueue.payload, '{}'), coalesce(enqueue.queue, 'default'),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.priority, 0), enqueue.dedup_key,
            enqueue.max_attempts, enqueue.traceparent, enqueue.tracestate, enqueue.flow_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO job_id;
    IF job_id IS NULL THEN
        SELECT e.id INTO job_id
        FROM {{.schema}}.enqueue_checked(enqueue.kind, enqueue.payload, enqueue.queue, enqueue.run_at,
                                         enqueue.priority, enqueue.dedup_key, enqueue.max_attempts,
                                         enqueue.traceparent, enqueue.tracestate, enqueue.flow_key) e;
    END IF;
    RETURN job_id;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text) FROM PUBLIC;

DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN SELECT g.grantee FROM pg_temp.pgdispatch_enqueue_grantees g ORDER BY 1 LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text), '
                                  '%I.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text) TO %s',
                                  {{.schema_literal}}, {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- A dispatch trigger may take its jobs' flow key from a column of the row
-- (add_trigger's flow_key, the column's name): event_triggers records it.
ALTER TABLE {{.schema}}.event_triggers ADD COLUMN IF NOT EXISTS flow_key text;

COMMENT ON COLUMN {{.schema}}.event_triggers.flow_key IS
    'the column of the table whose value is the jobs'' flow key (the new row''s, the old one''s for DELETE); NULL: no key';

-- dispatch_event is migration 014's, with TG_ARGV[3], when given, the
-- column whose value is the job's flow key: the new row's, or the old
-- row's for a DELETE. An empty or NULL value gives no key; one longer
-- than the column's bound is replaced by its SHA-256 (sha256:<hex>), so
-- that no value can fail the application's write and distinct values stay
-- distinct keys.
CREATE OR REPLACE FUNCTION {{.schema}}.dispatch_event() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    job_kind    text  := TG_ARGV[0];
    job_queue   text  := TG_ARGV[1];
    job_payload jsonb := TG_ARGV[2]::jsonb;
    parent      text  := NULLIF(pg_catalog.current_setting('pgdispatch.traceparent', true), '');
    state       text  := NULLIF(pg_catalog.current_setting('pgdispatch.tracestate', true), '');
    key         text;
    envelope    jsonb;
    field       text;
BEGIN
    envelope := pg_catalog.jsonb_build_object(
        'event_id', pg_catalog.gen_random_uuid(),
        'trigger',  TG_NAME,
        'op',       TG_OP,
        'schema',   TG_TABLE_SCHEMA,
        'table',    TG_TABLE_NAME,
        'at',       pg_catalog.now(),
        'new',      CASE WHEN TG_OP <> 'DELETE' THEN pg_catalog.to_jsonb(NEW) END,
        'old',      CASE WHEN TG_OP <> 'INSERT' THEN pg_catalog.to_jsonb(OLD) END);
    IF TG_NARGS > 3 THEN
        key := NULLIF(envelope -> (CASE WHEN TG_OP = 'DELETE' THEN 'old' ELSE 'new' END) ->> TG_ARGV[3], '');
        IF pg_catalog.char_length(key) > 256 THEN
            key := 'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding())), 'hex');
        END IF;
    END IF;
    -- http_callback POSTs data, rabbitmq publishes body; other kinds read event.
    field := CASE job_kind WHEN 'http_callback' THEN 'data' WHEN 'rabbitmq' THEN 'body' ELSE 'event' END;
    IF pg_catalog.jsonb_typeof(job_payload -> field) = 'object' THEN
        envelope := (job_payload -> field) || envelope;
    END IF;
    IF pg_catalog.octet_length(parent) > 128 THEN
        parent := NULL;
    END IF;
    IF parent IS NULL OR pg_catalog.octet_length(state) > 512 THEN
        state := NULL;
    END IF;
    INSERT INTO {{.schema}}.jobs (kind, queue, payload, traceparent, tracestate, flow_key)
    VALUES (job_kind, job_queue, pg_catalog.jsonb_set(job_payload, ARRAY[field], envelope), parent, state, key);
    RETURN NULL;
END
$$;

-- The dispatch triggers insert the flow key as the role that wrote the
-- application's row: a role that may insert the trace context (the writer
-- of docs/roles.sql) may insert the key too.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
        FROM pg_catalog.pg_attribute t
        JOIN pg_catalog.pg_class c ON c.oid = t.attrelid
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
             pg_catalog.aclexplode(t.attacl) a
        WHERE n.nspname = {{.schema_literal}} AND c.relname = 'jobs' AND t.attname = 'tracestate'
          AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT INSERT (flow_key) ON %I.jobs TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- add_trigger is migration 004's, with flow_key: the name of the table's
-- column whose value is the jobs' flow key (NULL: none). The trigger then
-- calls dispatch_event with the column's name as a fourth argument.
CREATE TEMPORARY TABLE pgdispatch_add_trigger_acl ON COMMIT DROP AS
SELECT p.proacl AS acl
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = {{.schema_literal}} AND p.proname = 'add_trigger';

DROP FUNCTION IF EXISTS {{.schema}}.add_trigger(text, text[], text, jsonb, text, text, text, interval);

CREATE OR REPLACE FUNCTION {{.schema}}.add_trigger(
    table_name   text,
    events       text[],
    kind         text,
    payload      jsonb    DEFAULT '{}',
    queue        text     DEFAULT 'default',
    when_expr    text     DEFAULT NULL,
    trigger_name text     DEFAULT NULL,
    lock_wait    interval DEFAULT '1 second',
    flow_key     text     DEFAULT NULL
) RETURNS TABLE (name text, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tbl       regclass;
    evs       text[];
    trig_name text;
    trig_fn   oid;
BEGIN
    tbl := add_trigger.table_name::regclass;
    IF add_trigger.kind IS NULL OR add_trigger.kind = '' THEN
        RAISE EXCEPTION 'kind is required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_trigger.queue IS NULL OR add_trigger.queue = '' THEN
        RAISE EXCEPTION 'queue must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(add_trigger.payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'payload must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(DISTINCT upper(btrim(e)) ORDER BY upper(btrim(e))) INTO evs FROM unnest(add_trigger.events) e;
    IF evs IS NULL OR NOT evs <@ ARRAY['DELETE', 'INSERT', 'UPDATE'] THEN
        RAISE EXCEPTION 'events must be some of insert, update and delete, not %', add_trigger.events
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_trigger.when_expr ~ '(;|--|/\*)' THEN
        RAISE EXCEPTION 'the WHEN condition may not contain ";" or comments'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_trigger.flow_key IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_attribute a
        WHERE a.attrelid = tbl AND a.attname = add_trigger.flow_key AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'the flow key''s column % is not a column of %', add_trigger.flow_key, tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    trig_name := coalesce(add_trigger.trigger_name,
                          (SELECT c.relname FROM pg_class c WHERE c.oid = tbl) || '_' || add_trigger.kind);

    IF EXISTS (SELECT 1 FROM {{.schema}}.event_triggers t WHERE t.name = trig_name) THEN
        RAISE NOTICE 'pgdispatch trigger % exists already: nothing changed (remove it first to change it)', trig_name;
        RETURN QUERY SELECT trig_name, false;
        RETURN;
    END IF;

    PERFORM set_config('lock_timeout', (extract(epoch FROM add_trigger.lock_wait) * 1000)::bigint::text, true);
    EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW %s EXECUTE FUNCTION %I.dispatch_event(%L, %L, %L%s)',
                   trig_name, array_to_string(evs, ' OR '), tbl,
                   CASE WHEN add_trigger.when_expr IS NULL THEN '' ELSE 'WHEN (' || add_trigger.when_expr || ')' END,
                   {{.schema_literal}}, add_trigger.kind, add_trigger.queue, add_trigger.payload::text,
                   CASE WHEN add_trigger.flow_key IS NULL THEN '' ELSE format(', %L', add_trigger.flow_key) END);
    SELECT t.tgfoid INTO trig_fn FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname = trig_name;
    IF trig_fn IS DISTINCT FROM (SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                                 WHERE n.nspname = {{.schema_literal}} AND p.proname = 'dispatch_event') THEN
        RAISE EXCEPTION 'the WHEN condition % is not a plain condition', add_trigger.when_expr
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {{.schema}}.event_triggers (name, table_oid, table_name, events, kind, queue, payload, when_expr, flow_key)
    VALUES (trig_name, tbl, tbl::text, evs, add_trigger.kind, add_trigger.queue, add_trigger.payload, add_trigger.when_expr,
            add_trigger.flow_key);
    RETURN QUERY SELECT trig_name, true;
END
$$;

-- The new add_trigger keeps the old one's privileges: every role's, when
-- they were not the default.
DO $$
DECLARE
    g record;
BEGIN
    IF (SELECT a.acl FROM pg_temp.pgdispatch_add_trigger_acl a) IS NULL THEN
        RETURN;
    END IF;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %I.add_trigger(text, text[], text, jsonb, text, text, text, interval, text) FROM PUBLIC',
                              {{.schema_literal}});
    FOR g IN
        SELECT DISTINCT CASE WHEN e.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(e.grantee)) END AS grantee
        FROM pg_temp.pgdispatch_add_trigger_acl a, pg_catalog.aclexplode(a.acl) e
        WHERE e.privilege_type = 'EXECUTE' AND e.grantee <> e.grantor
        ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.add_trigger(text, text[], text, jsonb, text, text, text, interval, text) TO %s',
                                  {{.schema_literal}}, g.grantee);
    END LOOP;
END
$$;
