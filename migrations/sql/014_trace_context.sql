-- The writer's trace context, for OpenTelemetry (docs/operations.md,
-- "Tracing"). {{.schema}} is the schema identifier and {{.schema_literal}}
-- its name as a string literal.

-- traceparent and tracestate: the W3C Trace Context headers of the writer's
-- span, as the writer sets them (enqueue()'s arguments of the same names,
-- or a plain INSERT). A worker with tracing on makes each attempt of the
-- job a child of that span; one that finds the value malformed ignores it
-- and starts a new trace. Their length is bounded, so that no writer
-- stores more than a header's worth in every claimed row: 128 bytes for
-- traceparent (version 00 is 55), 512 for tracestate (what W3C asks a
-- vendor to propagate at least). A column added with its constraint,
-- NULL in every row, is checked by a scan of the table, without a rewrite.
ALTER TABLE {{.schema}}.jobs
    ADD COLUMN IF NOT EXISTS traceparent text CONSTRAINT jobs_traceparent_length CHECK (octet_length(traceparent) <= 128);
ALTER TABLE {{.schema}}.jobs
    ADD COLUMN IF NOT EXISTS tracestate text CONSTRAINT jobs_tracestate_length CHECK (octet_length(tracestate) <= 512);

COMMENT ON COLUMN {{.schema}}.jobs.traceparent IS
    'the writer''s W3C traceparent (00-<trace id>-<span id>-<flags>): the job''s attempts are traced as its children; NULL or malformed: a trace of their own';
COMMENT ON COLUMN {{.schema}}.jobs.tracestate IS
    'the writer''s W3C tracestate, carried with traceparent';

-- enqueue() and enqueue_checked() take the two as optional arguments. A
-- function's arguments are its identity, so the old ones are dropped and
-- the new ones granted to the roles that could execute the old.
CREATE TEMPORARY TABLE pgdispatch_enqueue_grantees ON COMMIT DROP AS
SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
     pg_catalog.aclexplode(p.proacl) a
WHERE n.nspname = {{.schema_literal}} AND p.proname IN ('enqueue', 'enqueue_checked') AND a.privilege_type = 'EXECUTE'
  AND a.grantee <> p.proowner;

DROP FUNCTION IF EXISTS {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer);
DROP FUNCTION IF EXISTS {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer);

-- enqueue_checked is migration 013's, with the trace context.
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
                                           traceparent, tracestate)
        VALUES (enqueue_checked.kind, want_payload, want_queue, want_run_at, want_priority,
                enqueue_checked.dedup_key, enqueue_checked.max_attempts,
                enqueue_checked.traceparent, enqueue_checked.tracestate)
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

-- enqueue is migration 008's, with the trace context.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    tracestate   text        DEFAULT NULL
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
                                       traceparent, tracestate)
    VALUES (enqueue.kind, coalesce(enqueue.payload, '{}'), coalesce(enqueue.queue, 'default'),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.priority, 0), enqueue.dedup_key,
            enqueue.max_attempts, enqueue.traceparent, enqueue.tracestate)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO job_id;
    IF job_id IS NULL THEN
        SELECT e.id INTO job_id
        FROM {{.schema}}.enqueue_checked(enqueue.kind, enqueue.payload, enqueue.queue, enqueue.run_at,
                                         enqueue.priority, enqueue.dedup_key, enqueue.max_attempts,
                                         enqueue.traceparent, enqueue.tracestate) e;
    END IF;
    RETURN job_id;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text) FROM PUBLIC;

DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN SELECT g.grantee FROM pg_temp.pgdispatch_enqueue_grantees g ORDER BY 1 LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text), '
                                  '%I.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text) TO %s',
                                  {{.schema_literal}}, {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- A dispatch trigger's job takes the trace context of the writer's
-- transaction, set with SET LOCAL pgdispatch.traceparent (and
-- pgdispatch.tracestate): the application's own tables have no column for
-- it. A value past the columns' bounds is left out, so that no setting can
-- fail the application's write; a malformed one is ignored by the workers.
-- As migration 004's, the function has no SET clause, and names
-- pg_catalog's functions in full.
CREATE OR REPLACE FUNCTION {{.schema}}.dispatch_event() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    job_kind    text  := TG_ARGV[0];
    job_queue   text  := TG_ARGV[1];
    job_payload jsonb := TG_ARGV[2]::jsonb;
    parent      text  := NULLIF(pg_catalog.current_setting('pgdispatch.traceparent', true), '');
    state       text  := NULLIF(pg_catalog.current_setting('pgdispatch.tracestate', true), '');
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
    INSERT INTO {{.schema}}.jobs (kind, queue, payload, traceparent, tracestate)
    VALUES (job_kind, job_queue, pg_catalog.jsonb_set(job_payload, ARRAY[field], envelope), parent, state);
    RETURN NULL;
END
$$;
