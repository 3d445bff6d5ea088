-- Dispatch triggers on the application's own tables (package triggers).
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal, both already quoted by the migrator.
--
-- add_trigger attaches a row trigger to a table that enqueues one job per
-- changed row, in the writer's own transaction: a rolled-back write creates
-- no job. The job's payload is the one given, with an event envelope merged
-- in (the field it goes to depends on the kind, see dispatch_event).

-- The triggers added, for list and remove.
CREATE TABLE {{.schema}}.event_triggers (
    name       text PRIMARY KEY,
    table_oid  oid         NOT NULL,
    table_name text        NOT NULL,
    events     text[]      NOT NULL,
    kind       text        NOT NULL,
    queue      text        NOT NULL,
    payload    jsonb       NOT NULL,
    when_expr  text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The trigger function: TG_ARGV is (kind, queue, payload). It has no SET
-- clause, which would undo at every row the jobs trigger's note that it has
-- notified (migration 003), so it names pg_catalog's functions in full.
CREATE FUNCTION {{.schema}}.dispatch_event() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    job_kind    text  := TG_ARGV[0];
    job_queue   text  := TG_ARGV[1];
    job_payload jsonb := TG_ARGV[2]::jsonb;
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
    INSERT INTO {{.schema}}.jobs (kind, queue, payload)
    VALUES (job_kind, job_queue, pg_catalog.jsonb_set(job_payload, ARRAY[field], envelope));
    RETURN NULL;
END
$$;

-- add_trigger attaches a dispatch trigger named trigger_name (default:
-- <table>_<kind>) to table_name, which is read as SQL would read it
-- ('public.orders', '"Odd ""name"""'). It returns the trigger's name and
-- whether it was created: a trigger of that name that exists already is left
-- as it is, with a notice. The DDL waits at most lock_wait for its lock,
-- so that writers never queue long behind it.
--
-- when_expr is a trigger WHEN condition over NEW and OLD. It may not contain
-- ';' or comments, so it cannot end the statement it is written into, and
-- the trigger created is checked to call dispatch_event: it can run nothing
-- the caller could not run with CREATE TRIGGER on the table.
CREATE FUNCTION {{.schema}}.add_trigger(
    table_name   text,
    events       text[],
    kind         text,
    payload      jsonb    DEFAULT '{}',
    queue        text     DEFAULT 'default',
    when_expr    text     DEFAULT NULL,
    trigger_name text     DEFAULT NULL,
    lock_wait    interval DEFAULT '1 second'
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
    trig_name := coalesce(add_trigger.trigger_name,
                          (SELECT c.relname FROM pg_class c WHERE c.oid = tbl) || '_' || add_trigger.kind);

    IF EXISTS (SELECT 1 FROM {{.schema}}.event_triggers t WHERE t.name = trig_name) THEN
        RAISE NOTICE 'pgdispatch trigger % exists already: nothing changed (remove it first to change it)', trig_name;
        RETURN QUERY SELECT trig_name, false;
        RETURN;
    END IF;

    PERFORM set_config('lock_timeout', (extract(epoch FROM add_trigger.lock_wait) * 1000)::bigint::text, true);
    EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW %s EXECUTE FUNCTION %I.dispatch_event(%L, %L, %L)',
                   trig_name, array_to_string(evs, ' OR '), tbl,
                   CASE WHEN add_trigger.when_expr IS NULL THEN '' ELSE 'WHEN (' || add_trigger.when_expr || ')' END,
                   {{.schema_literal}}, add_trigger.kind, add_trigger.queue, add_trigger.payload::text);
    SELECT t.tgfoid INTO trig_fn FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname = trig_name;
    IF trig_fn IS DISTINCT FROM (SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                                 WHERE n.nspname = {{.schema_literal}} AND p.proname = 'dispatch_event') THEN
        RAISE EXCEPTION 'the WHEN condition % is not a plain condition', add_trigger.when_expr
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {{.schema}}.event_triggers (name, table_oid, table_name, events, kind, queue, payload, when_expr)
    VALUES (trig_name, tbl, tbl::text, evs, add_trigger.kind, add_trigger.queue, add_trigger.payload, add_trigger.when_expr);
    RETURN QUERY SELECT trig_name, true;
END
$$;

-- remove_trigger drops a trigger add_trigger made, waiting at most lock_wait
-- for the table's lock.
CREATE FUNCTION {{.schema}}.remove_trigger(trigger_name text, lock_wait interval DEFAULT '1 second')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t {{.schema}}.event_triggers;
BEGIN
    SELECT * INTO t FROM {{.schema}}.event_triggers e WHERE e.name = remove_trigger.trigger_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no pgdispatch trigger is named %', remove_trigger.trigger_name
            USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM set_config('lock_timeout', (extract(epoch FROM remove_trigger.lock_wait) * 1000)::bigint::text, true);
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.table_oid) THEN
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', t.name, t.table_oid::regclass);
    END IF;
    DELETE FROM {{.schema}}.event_triggers e WHERE e.name = t.name;
END
$$;
