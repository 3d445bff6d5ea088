-- The pgdispatch schema as the migrations in sql/ build it, read back from
-- the catalog of a freshly migrated schema: tables, indexes, views,
-- functions and triggers, each in name order. It is generated and checked
-- by TestSchemaSnapshot; the migrations are what runs. Write it again with
--
--   go test ./migrations -run TestSchemaSnapshot -update
--
-- The sleep key's first half, written into the triggers as a literal, is
-- migrations.SleepKey of the schema's name; here it is the schema pgdispatch's.

-- Tables

CREATE TABLE endpoint_events (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    endpoint text NOT NULL,
    event text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    by_role text DEFAULT SESSION_USER NOT NULL,
    reason text,
    note text,
    job_id bigint,
    reported_at timestamp with time zone,
    CONSTRAINT endpoint_events_actor_check CHECK ((actor = ANY (ARRAY['breaker'::text, 'operator'::text]))),
    CONSTRAINT endpoint_events_endpoint_check CHECK (((char_length(endpoint) >= 1) AND (char_length(endpoint) <= 300))),
    CONSTRAINT endpoint_events_event_check CHECK ((event = ANY (ARRAY['opened'::text, 'closed'::text, 'disabled'::text, 'enabled'::text]))),
    CONSTRAINT endpoint_events_note_check CHECK ((char_length(note) <= 1000)),
    CONSTRAINT endpoint_events_pkey PRIMARY KEY (id),
    CONSTRAINT endpoint_events_reason_check CHECK ((char_length(reason) <= 300))
);

CREATE TABLE endpoints (
    endpoint text NOT NULL,
    state text DEFAULT 'closed'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    window_started_at timestamp with time zone DEFAULT now() NOT NULL,
    opened_at timestamp with time zone,
    open_until timestamp with time zone,
    cool_down interval,
    probe_until timestamp with time zone,
    reason text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    disabled_at timestamp with time zone,
    disabled_by text,
    note text,
    cool_down_kept_until timestamp with time zone,
    CONSTRAINT endpoints_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT endpoints_disabled_by_check CHECK ((disabled_by = ANY (ARRAY['breaker'::text, 'operator'::text]))),
    CONSTRAINT endpoints_endpoint_check CHECK (((char_length(endpoint) >= 1) AND (char_length(endpoint) <= 300))),
    CONSTRAINT endpoints_failures_check CHECK ((failures >= 0)),
    CONSTRAINT endpoints_note_check CHECK (((char_length(note) >= 1) AND (char_length(note) <= 1000))),
    CONSTRAINT endpoints_pkey PRIMARY KEY (endpoint),
    CONSTRAINT endpoints_reason_check CHECK ((char_length(reason) <= 300)),
    CONSTRAINT endpoints_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text])))
);

CREATE TABLE event_triggers (
    name text NOT NULL,
    table_oid oid NOT NULL,
    table_name text NOT NULL,
    events text[] NOT NULL,
    kind text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    when_expr text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    flow_key text,
    CONSTRAINT event_triggers_pkey PRIMARY KEY (name)
);

CREATE TABLE flow_keys (
    queue text NOT NULL,
    key text NOT NULL,
    head bigint,
    starts timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    CONSTRAINT flow_keys_pkey PRIMARY KEY (queue, key)
);

CREATE TABLE flow_limits (
    queue text NOT NULL,
    key text,
    concurrency integer,
    strict boolean DEFAULT false NOT NULL,
    rate integer,
    per interval,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT flow_limits_concurrency_check CHECK (((concurrency >= 1) AND (concurrency <= 100000))),
    CONSTRAINT flow_limits_key_check CHECK (((char_length(key) >= 1) AND (char_length(key) <= 256))),
    CONSTRAINT flow_limits_per_check CHECK (((per > '00:00:00'::interval) AND (per <= '1 day'::interval))),
    CONSTRAINT flow_limits_queue_check CHECK (((char_length(queue) >= 1) AND (char_length(queue) <= 128))),
    CONSTRAINT flow_limits_rate_check CHECK (((rate >= 1) AND (rate <= 10000))),
    CONSTRAINT flow_limits_rate_per_check CHECK (((rate IS NULL) = (per IS NULL)))
);

CREATE TABLE jobs (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer,
    dedup_key text,
    last_error text,
    locked_by text,
    locked_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    errors jsonb,
    result jsonb,
    created_by oid DEFAULT (to_regrole(quote_ident((SESSION_USER)::text)))::oid,
    traceparent text,
    tracestate text,
    flow_key text,
    CONSTRAINT jobs_attempts_check CHECK (((attempts >= 0) AND (attempts <= 1000000))),
    CONSTRAINT jobs_dedup_key_check CHECK ((char_length(dedup_key) <= 512)),
    CONSTRAINT jobs_flow_key_check CHECK (((char_length(flow_key) >= 1) AND (char_length(flow_key) <= 256))),
    CONSTRAINT jobs_kind_check CHECK (((char_length(kind) >= 1) AND (char_length(kind) <= 128))),
    CONSTRAINT jobs_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000000))),
    CONSTRAINT jobs_payload_size_check CHECK ((pg_column_size(payload) <= 1048576)),
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_queue_check CHECK (((char_length(queue) >= 1) AND (char_length(queue) <= 128))),
    CONSTRAINT jobs_run_at_check CHECK (((run_at >= '0001-01-01 00:00:00+00'::timestamp with time zone) AND (run_at < '9999-01-01 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT jobs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'dead'::text, 'cancelled'::text]))),
    CONSTRAINT jobs_traceparent_length CHECK ((octet_length(traceparent) <= 128)),
    CONSTRAINT jobs_tracestate_length CHECK ((octet_length(tracestate) <= 512))
);

CREATE TABLE queues (
    name text NOT NULL,
    paused_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    limited boolean DEFAULT false NOT NULL,
    CONSTRAINT queues_name_check CHECK (((char_length(name) >= 1) AND (char_length(name) <= 128))),
    CONSTRAINT queues_pkey PRIMARY KEY (name)
);

CREATE TABLE schedules (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    name text NOT NULL,
    cron text,
    every interval,
    time_zone text DEFAULT 'UTC'::text NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    queue text DEFAULT 'default'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    max_attempts integer,
    catch_up text DEFAULT 'skip'::text NOT NULL,
    catch_up_limit integer DEFAULT 100 NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    next_run_at timestamp with time zone,
    last_run_at timestamp with time zone,
    runs bigint DEFAULT 0 NOT NULL,
    missed bigint DEFAULT 0 NOT NULL,
    caught_up bigint DEFAULT 0 NOT NULL,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    taken bigint DEFAULT 0 NOT NULL,
    warning text,
    CONSTRAINT schedules_catch_up_check CHECK ((catch_up = ANY (ARRAY['skip'::text, 'all'::text]))),
    CONSTRAINT schedules_catch_up_limit_check CHECK (((catch_up_limit >= 1) AND (catch_up_limit <= 1000))),
    CONSTRAINT schedules_kind_check CHECK (((char_length(kind) >= 1) AND (char_length(kind) <= 128))),
    CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000000))),
    CONSTRAINT schedules_name_check CHECK (((char_length(name) >= 1) AND (char_length(name) <= 200))),
    CONSTRAINT schedules_name_key UNIQUE (name),
    CONSTRAINT schedules_next_run_at_check CHECK (((next_run_at >= '0001-01-01 00:00:00+00'::timestamp with time zone) AND (next_run_at < '9999-01-01 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT schedules_payload_size_check CHECK ((pg_column_size(payload) <= 1048576)),
    CONSTRAINT schedules_pkey PRIMARY KEY (id),
    CONSTRAINT schedules_queue_check CHECK (((char_length(queue) >= 1) AND (char_length(queue) <= 128))),
    CONSTRAINT schedules_timing_check CHECK ((num_nonnulls(cron, every) = 1))
);

CREATE TABLE schema_version (
    version integer NOT NULL
);

CREATE TABLE signing_secrets (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    secret bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    CONSTRAINT signing_secrets_expires_at_check CHECK ((expires_at >= created_at)),
    CONSTRAINT signing_secrets_pkey PRIMARY KEY (id),
    CONSTRAINT signing_secrets_secret_check CHECK (((octet_length(secret) >= 16) AND (octet_length(secret) <= 64)))
);

-- Indexes

CREATE INDEX endpoint_events_at_idx ON pgdispatch.endpoint_events USING btree (at);

CREATE INDEX endpoint_events_endpoint_idx ON pgdispatch.endpoint_events USING btree (endpoint, id);

CREATE UNIQUE INDEX endpoint_events_pkey ON pgdispatch.endpoint_events USING btree (id);

CREATE INDEX endpoint_events_unreported_idx ON pgdispatch.endpoint_events USING btree (id) WHERE (reported_at IS NULL);

CREATE UNIQUE INDEX endpoints_pkey ON pgdispatch.endpoints USING btree (endpoint);

CREATE UNIQUE INDEX event_triggers_pkey ON pgdispatch.event_triggers USING btree (name);

CREATE UNIQUE INDEX flow_keys_pkey ON pgdispatch.flow_keys USING btree (queue, key);

CREATE UNIQUE INDEX flow_limits_queue_key_idx ON pgdispatch.flow_limits USING btree (queue, COALESCE(key, ''::text));

CREATE INDEX jobs_claim_idx ON pgdispatch.jobs USING btree (queue, priority, run_at, id) WHERE (status = 'pending'::text);

CREATE UNIQUE INDEX jobs_dedup_key_idx ON pgdispatch.jobs USING btree (dedup_key) WHERE (dedup_key IS NOT NULL);

CREATE INDEX jobs_finished_idx ON pgdispatch.jobs USING btree (status, finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX jobs_flow_pending_idx ON pgdispatch.jobs USING btree (queue, flow_key, priority, run_at, id) WHERE ((status = 'pending'::text) AND (flow_key IS NOT NULL));

CREATE INDEX jobs_flow_running_idx ON pgdispatch.jobs USING btree (queue, flow_key) WHERE ((status = 'running'::text) AND (flow_key IS NOT NULL));

CREATE INDEX jobs_kind_idx ON pgdispatch.jobs USING btree (kind, queue, run_at, id) WHERE (status = 'pending'::text);

CREATE INDEX jobs_lease_idx ON pgdispatch.jobs USING btree (locked_until) WHERE (status = 'running'::text);

CREATE UNIQUE INDEX jobs_pkey ON pgdispatch.jobs USING btree (id);

CREATE INDEX jobs_schedule_idx ON pgdispatch.jobs USING btree (queue, run_at) WHERE (status = 'pending'::text);

CREATE UNIQUE INDEX queues_pkey ON pgdispatch.queues USING btree (name);

CREATE UNIQUE INDEX schedules_name_key ON pgdispatch.schedules USING btree (name);

CREATE INDEX schedules_next_run_idx ON pgdispatch.schedules USING btree (next_run_at) WHERE (enabled AND (error IS NULL));

CREATE UNIQUE INDEX schedules_pkey ON pgdispatch.schedules USING btree (id);

CREATE UNIQUE INDEX signing_secrets_pkey ON pgdispatch.signing_secrets USING btree (id);

-- Views

-- Functions

CREATE OR REPLACE FUNCTION pgdispatch.add_trigger(table_name text, events text[], kind text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT 'default'::text, when_expr text DEFAULT NULL::text, trigger_name text DEFAULT NULL::text, lock_wait interval DEFAULT '00:00:01'::interval, flow_key text DEFAULT NULL::text)
 RETURNS TABLE(name text, created boolean)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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

    IF EXISTS (SELECT 1 FROM pgdispatch.event_triggers t WHERE t.name = trig_name) THEN
        RAISE NOTICE 'pgdispatch trigger % exists already: nothing changed (remove it first to change it)', trig_name;
        RETURN QUERY SELECT trig_name, false;
        RETURN;
    END IF;

    PERFORM set_config('lock_timeout', (extract(epoch FROM add_trigger.lock_wait) * 1000)::bigint::text, true);
    EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW %s EXECUTE FUNCTION %I.dispatch_event(%L, %L, %L%s)',
                   trig_name, array_to_string(evs, ' OR '), tbl,
                   CASE WHEN add_trigger.when_expr IS NULL THEN '' ELSE 'WHEN (' || add_trigger.when_expr || ')' END,
                   E'pgdispatch', add_trigger.kind, add_trigger.queue, add_trigger.payload::text,
                   CASE WHEN add_trigger.flow_key IS NULL THEN '' ELSE format(', %L', add_trigger.flow_key) END);
    SELECT t.tgfoid INTO trig_fn FROM pg_trigger t WHERE t.tgrelid = tbl AND t.tgname = trig_name;
    IF trig_fn IS DISTINCT FROM (SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                                 WHERE n.nspname = E'pgdispatch' AND p.proname = 'dispatch_event') THEN
        RAISE EXCEPTION 'the WHEN condition % is not a plain condition', add_trigger.when_expr
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgdispatch.event_triggers (name, table_oid, table_name, events, kind, queue, payload, when_expr, flow_key)
    VALUES (trig_name, tbl, tbl::text, evs, add_trigger.kind, add_trigger.queue, add_trigger.payload, add_trigger.when_expr,
            add_trigger.flow_key);
    RETURN QUERY SELECT trig_name, true;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.cancel(VARIADIC ids bigint[])
 RETURNS TABLE(id bigint, previous_status text, cancelled boolean)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    found_ids      bigint[];
    found_statuses text[];
    changed        boolean[];
    running        bigint[];
    running_queues text[];
BEGIN
    WITH l AS (
        SELECT j.id, j.status, j.queue FROM pgdispatch.jobs j WHERE j.id = ANY(cancel.ids) ORDER BY j.id FOR UPDATE
    ), u AS (
        UPDATE pgdispatch.jobs j
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
            jsonb_build_object('schema', E'pgdispatch', 'cancel', to_jsonb(running[i * 300 + 1 : (i + 1) * 300]))::text);
    END LOOP;
    IF running_queues IS NOT NULL THEN
        PERFORM pgdispatch.flow_ended(running_queues);
    END IF;

    RETURN QUERY SELECT f.id, f.status, f.changed FROM unnest(found_ids, found_statuses, changed) AS f(id, status, changed);
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.check_endpoint(endpoint text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF endpoint IS NULL OR endpoint !~ '^[a-z][a-z0-9+.-]*://([^/?#@:\[\]A-Z]+|\[[0-9a-f:.]+\]):[0-9]{1,5}$'
       OR pg_catalog.char_length(endpoint) > 300 THEN
        RAISE EXCEPTION 'not an endpoint: %', endpoint
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An endpoint is a URL''s scheme, lowercased host and port, as endpoints list shows it: https://hooks.example.com:443.';
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.check_payload_size()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    -- || detoasts its operands: the size of the result is the decompressed
    -- size (an object joined with {} is itself).
    size       integer := pg_column_size(NEW.payload || '{}'::jsonb);
    constraint_name text := TG_TABLE_NAME || '_payload_size_check';
BEGIN
    IF size > 1048576 THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, constraint_name
            USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  CONSTRAINT = constraint_name,
                  DETAIL = format('The payload is %s bytes decompressed; the limit is 1048576 (1 MiB).', size);
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.check_schedule()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    fields   text[];
    part     text;
    m        text[];
    lo       integer;
    hi       integer;
    a        integer;
    b        integer;
    names    text[];
    what     text;
    secs     numeric;
    timing   boolean := TG_OP = 'INSERT'
                        OR NEW.cron IS DISTINCT FROM OLD.cron
                        OR NEW.every IS DISTINCT FROM OLD.every
                        OR NEW.time_zone IS DISTINCT FROM OLD.time_zone;
BEGIN
    IF num_nonnulls(NEW.cron, NEW.every) <> 1 THEN
        RAISE EXCEPTION 'schedule %: give a cron expression or an interval (every), not %',
            NEW.name, CASE WHEN NEW.cron IS NULL THEN 'neither' ELSE 'both' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF NEW.catch_up IS DISTINCT FROM 'skip' AND NEW.catch_up IS DISTINCT FROM 'all' THEN
        RAISE EXCEPTION 'schedule %: catch_up is skip (one job after downtime) or all (one job per missed slot), not %', NEW.name, coalesce(NEW.catch_up, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF timing AND NEW.cron IS NOT NULL THEN
        NEW.cron := btrim(regexp_replace(NEW.cron, '\s+', ' ', 'g'));
        IF NEW.cron ~ '^@' THEN
            IF NEW.cron ~* '^@every' THEN
                RAISE EXCEPTION 'schedule %: cron "%" is an interval: pass it as every (every => ''1 hour'')', NEW.name, NEW.cron
                    USING ERRCODE = 'invalid_parameter_value';
            ELSIF NEW.cron NOT IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight', '@hourly') THEN
                RAISE EXCEPTION 'schedule %: cron "%" is no shortcut pgdispatch knows: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or five fields', NEW.name, NEW.cron
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        ELSE
            IF NEW.cron ~* '^(CRON_)?TZ=' THEN
                RAISE EXCEPTION 'schedule %: cron "%" names a time zone: give it as time_zone instead', NEW.name, NEW.cron
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            fields := string_to_array(NEW.cron, ' ');
            IF coalesce(cardinality(fields), 0) <> 5 THEN
                RAISE EXCEPTION 'schedule %: cron "%" has % fields; it needs 5: minute hour day-of-month month day-of-week, or a shortcut such as @daily',
                    NEW.name, NEW.cron, coalesce(cardinality(fields), 0)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            FOR i IN 1 .. 5 LOOP
                what := (ARRAY['minute', 'hour', 'day of month', 'month', 'day of week'])[i];
                lo := (ARRAY[0, 0, 1, 1, 0])[i];
                hi := (ARRAY[59, 23, 31, 12, 6])[i];
                names := CASE i
                    WHEN 4 THEN ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']
                    WHEN 5 THEN ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']
                END;
                FOREACH part IN ARRAY string_to_array(fields[i], ',') LOOP
                    m := regexp_match(lower(part), '^(?:([*?])|([0-9]+|[a-z]+)(?:-([0-9]+|[a-z]+))?)(?:/([0-9]+))?$');
                    IF m IS NULL THEN
                        RAISE EXCEPTION 'schedule %: cron "%": the % field''s "%" is not *, a value or a range a-b, with an optional /step',
                            NEW.name, NEW.cron, what, part
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                    IF m[1] IS NOT NULL THEN
                        a := lo;
                        b := hi;
                    ELSE
                        a := CASE WHEN m[2] ~ '^[0-9]+$' THEN least(m[2]::numeric, 1000)::integer
                                  ELSE array_position(names, m[2]) - 1 + (CASE WHEN i = 4 THEN 1 ELSE 0 END) END;
                        b := CASE WHEN m[3] IS NULL THEN (CASE WHEN m[4] IS NULL THEN a ELSE hi END)
                                  WHEN m[3] ~ '^[0-9]+$' THEN least(m[3]::numeric, 1000)::integer
                                  ELSE array_position(names, m[3]) - 1 + (CASE WHEN i = 4 THEN 1 ELSE 0 END) END;
                        IF a IS NULL OR b IS NULL THEN
                            RAISE EXCEPTION 'schedule %: cron "%": the % field''s "%" names no %', NEW.name, NEW.cron, what, part,
                                CASE i WHEN 4 THEN 'month (jan to dec)' WHEN 5 THEN 'day (sun to sat)' ELSE 'value: this field takes numbers' END
                                USING ERRCODE = 'invalid_parameter_value';
                        END IF;
                        IF a < lo OR b > hi THEN
                            RAISE EXCEPTION 'schedule %: cron "%": the % field''s "%" is outside % to %', NEW.name, NEW.cron, what, part, lo, hi
                                USING ERRCODE = 'invalid_parameter_value';
                        ELSIF a > b THEN
                            RAISE EXCEPTION 'schedule %: cron "%": the % field''s range "%" ends before it starts', NEW.name, NEW.cron, what, part
                                USING ERRCODE = 'invalid_parameter_value';
                        END IF;
                    END IF;
                    IF m[4] IS NOT NULL AND least(m[4]::numeric, 1000) = 0 THEN
                        RAISE EXCEPTION 'schedule %: cron "%": the % field''s "%" has a step of 0', NEW.name, NEW.cron, what, part
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                END LOOP;
            END LOOP;
        END IF;
    END IF;

    IF timing AND NEW.every IS NOT NULL THEN
        secs := extract(epoch FROM NEW.every);
        IF date_part('month', NEW.every) <> 0 OR date_part('year', NEW.every) <> 0 THEN
            RAISE EXCEPTION 'schedule %: every % counts months, whose length varies: use a cron expression such as @monthly', NEW.name, NEW.every
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF secs < 1 OR secs <> trunc(secs) THEN
            RAISE EXCEPTION 'schedule %: every % must be a whole number of seconds, at least 1', NEW.name, NEW.every
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    IF timing AND (NEW.time_zone IN ('localtime', 'posixrules', 'Factory')
                   OR NOT EXISTS (SELECT FROM pg_catalog.pg_timezone_names z WHERE z.name = NEW.time_zone)) THEN
        RAISE EXCEPTION 'schedule %: time zone "%" is unknown: give an IANA name such as Europe/Berlin, or UTC', NEW.name, NEW.time_zone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF TG_OP = 'UPDATE' THEN
        IF timing OR (NEW.enabled AND NOT OLD.enabled) THEN
            NEW.next_run_at := NULL;
        END IF;
        IF timing OR NEW.enabled IS DISTINCT FROM OLD.enabled OR NEW.kind IS DISTINCT FROM OLD.kind
           OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.queue IS DISTINCT FROM OLD.queue
           OR NEW.priority IS DISTINCT FROM OLD.priority OR NEW.max_attempts IS DISTINCT FROM OLD.max_attempts
           OR NEW.catch_up IS DISTINCT FROM OLD.catch_up OR NEW.catch_up_limit IS DISTINCT FROM OLD.catch_up_limit
           OR NEW.next_run_at IS DISTINCT FROM OLD.next_run_at THEN
            NEW.error := NULL;
            NEW.updated_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.claim_flow(claim_queue text, claim_limit integer, claim_worker text, lease_seconds double precision, default_max_attempts integer, max_bytes bigint, after_key text, look_unkeyed boolean)
 RETURNS TABLE(id bigint, kind text, payload jsonb, priority smallint, attempts integer, max_attempts integer, run_at timestamp with time zone, created_at timestamp with time zone, updated_at timestamp with time zone, next_in double precision, stranded boolean, paused boolean, claimed_at timestamp with time zone, took double precision, traceparent text, tracestate text, limited boolean, held boolean, cursor_key text, unkeyed boolean)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
AS $function$
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
    FROM pgdispatch.queues q WHERE q.name = claim_queue;
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
    FROM pgdispatch.flow_limits f WHERE f.queue = claim_queue;

    -- Nothing due in the queue (a claim woken by a job scheduled ahead, a
    -- timer early, the fallback tick): no walk, whose steps pass over the
    -- entries of every job ahead. The queue's first due job, by
    -- jobs_schedule_idx, in one descent (a scalar subquery keeps its ORDER
    -- BY, which an EXISTS drops, and with it the index that ends at the
    -- first job not due).
    IF (SELECT j.run_at FROM pgdispatch.jobs j
        WHERE j.queue = claim_queue AND j.status = 'pending' AND j.run_at <= t0
        ORDER BY j.queue, j.run_at LIMIT 1) IS NULL THEN
        part := 4;
    ELSE
        -- With few jobs due (16 at most), their keys, read by
        -- jobs_schedule_idx (a heap fetch each), are the keys the walk
        -- takes, in key order: its steps would pass over the entries of
        -- every keyed job ahead between them.
        due_keys := ARRAY(SELECT j.flow_key FROM pgdispatch.jobs j
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
                    (SELECT p.priority, p.run_at, p.id, 1 FROM pgdispatch.jobs p
                     WHERE p.status = 'pending' AND p.queue = claim_queue
                     ORDER BY p.priority, p.run_at, p.id LIMIT 1)
                  UNION ALL
                    SELECT n.priority, n.run_at, n.id, pr.depth + 1 FROM pr CROSS JOIN LATERAL (
                        SELECT p.priority, p.run_at, p.id FROM pgdispatch.jobs p
                        WHERE p.status = 'pending' AND p.queue = claim_queue AND p.priority > pr.priority
                          AND p.run_at <= CASE WHEN pr.depth < 16 THEN 'infinity'::timestamptz ELSE t0 END
                        ORDER BY p.priority, p.run_at, p.id LIMIT 1) n
                )
                SELECT f.id FROM (
                    SELECT d.id, d.flow_key FROM pr CROSS JOIN LATERAL (
                        SELECT p.id, p.flow_key FROM pgdispatch.jobs p
                        WHERE p.status = 'pending' AND p.queue = claim_queue AND p.priority = pr.priority
                          AND (p.run_at, p.id) >= (pr.run_at, pr.id) AND p.run_at <= t0
                        ORDER BY p.run_at, p.id LIMIT least(4 * want, 1000)) d
                    LIMIT least(4 * want, 1000)) f
                WHERE f.flow_key IS NULL);
            FOR r IN
                SELECT j.id, j.ctid, CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                                  ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                FROM pgdispatch.jobs j
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
            SELECT (SELECT j.flow_key FROM pgdispatch.jobs j
                    WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > from_key AND j.run_at <= t0
                    ORDER BY j.queue, j.flow_key LIMIT 1)
            WHERE due_keys IS NULL
          UNION ALL
            SELECT (SELECT j.flow_key FROM pgdispatch.jobs j
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
                            (SELECT count(*) FROM (SELECT FROM pgdispatch.jobs j
                                                   WHERE j.queue = claim_queue AND j.flow_key >= l.key AND j.flow_key <= l.key
                                                     AND j.status = 'running'
                                                   ORDER BY j.queue, j.flow_key) r)
                        END AS running
            FROM l
        ), d AS MATERIALIZED (
            SELECT c.key, coalesce(c.running >= c.most, false) AS full,
                   CASE WHEN NOT c.limited THEN true
                        WHEN c.running >= c.most THEN false
                        ELSE pg_try_advisory_xact_lock(hashtextextended(E'pgdispatch' || '/' || claim_queue || '/' || c.key, 0))
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
                           (SELECT f.head FROM pgdispatch.flow_keys f WHERE f.queue = claim_queue AND f.key = k.key)
                       END AS head,
                       CASE WHEN k.rate IS NOT NULL THEN
                           (SELECT f.starts FROM pgdispatch.flow_keys f WHERE f.queue = claim_queue AND f.key = k.key)
                       END AS starts,
                       CASE WHEN k.conc IS NOT NULL OR k.strict THEN
                           (SELECT count(*) FROM (SELECT FROM pgdispatch.jobs j
                                                  WHERE j.queue = claim_queue AND j.flow_key >= k.key AND j.flow_key <= k.key
                                                    AND j.status = 'running'
                                                  ORDER BY j.queue, j.flow_key) r)::integer
                       ELSE 0 END AS running
                FROM k
            ), s AS MATERIALIZED (
                SELECT f.*,
                       CASE WHEN f.head IS NOT NULL THEN
                           (SELECT h.status FROM pgdispatch.jobs h
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
                                     (SELECT j.id FROM pgdispatch.jobs j
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
                 FROM pgdispatch.jobs j
                 WHERE NOT c.strict AND j.queue = claim_queue AND j.flow_key >= c.key AND j.flow_key <= c.key
                   AND j.status = 'pending' AND j.run_at <= t0
                 ORDER BY j.queue, j.flow_key, j.priority, j.run_at, j.id
                 LIMIT coalesce(c.cap, want)
                 FOR UPDATE SKIP LOCKED) n
                UNION ALL
                SELECT * FROM (SELECT j.id, j.ctid, j.run_at,
                        CASE WHEN pg_column_compression(j.payload) IS NULL THEN pg_column_size(j.payload)
                             ELSE pg_column_size(j.payload || '{}'::jsonb) END AS size
                 FROM pgdispatch.jobs j
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
              AND EXISTS (SELECT FROM pgdispatch.jobs j
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
        INSERT INTO pgdispatch.flow_keys AS fk (queue, key, head, starts)
        SELECT claim_queue, s.key, s.head,
               CASE WHEN s.per IS NULL THEN '{}'
                    ELSE ARRAY(SELECT x FROM unnest(o.starts) x WHERE x > t_rec - s.per * 1.02 ORDER BY x)
                         || array_fill(t_rec, ARRAY[s.n]) END
        FROM (SELECT u.key, max(u.head) AS head, max(u.per) AS per, count(*)::integer AS n
              FROM unnest(st_keys, st_head, st_per) u(key, head, per) GROUP BY u.key) s
        LEFT JOIN pgdispatch.flow_keys o ON o.queue = claim_queue AND o.key = s.key
        ORDER BY s.key
        ON CONFLICT (queue, key) DO UPDATE SET head = coalesce(EXCLUDED.head, fk.head), starts = EXCLUDED.starts;
    END IF;

    IF taken < claim_limit THEN
        v_next_in := least(
            (SELECT extract(epoch FROM j.run_at - t0)::float8 FROM pgdispatch.jobs j
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
        SELECT (SELECT j.flow_key FROM pgdispatch.jobs j
                WHERE j.queue = claim_queue AND j.status = 'pending' AND j.flow_key > ''
                ORDER BY j.queue, j.flow_key LIMIT 1),
               (SELECT j.flow_key FROM pgdispatch.jobs j
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
        UPDATE pgdispatch.jobs j
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
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.clear_flow_limit(queue text, key text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    removed boolean;
BEGIN
    DELETE FROM pgdispatch.flow_limits l
    WHERE l.queue = clear_flow_limit.queue AND coalesce(l.key, '') = coalesce(clear_flow_limit.key, '');
    removed := FOUND;
    PERFORM FROM pgdispatch.queues q WHERE q.name = clear_flow_limit.queue FOR UPDATE;
    IF NOT EXISTS (SELECT FROM pgdispatch.flow_limits l WHERE l.queue = clear_flow_limit.queue) THEN
        UPDATE pgdispatch.queues q SET limited = false, updated_at = now()
        WHERE q.name = clear_flow_limit.queue AND q.limited;
    END IF;
    RETURN removed;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.disable_endpoint(endpoint text, note text DEFAULT NULL::text, event_kind text DEFAULT NULL::text, event_queue text DEFAULT NULL::text, event_payload jsonb DEFAULT NULL::jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    e pgdispatch.endpoints;
BEGIN
    PERFORM pgdispatch.check_endpoint(disable_endpoint.endpoint);
    INSERT INTO pgdispatch.endpoints AS x (endpoint) VALUES (disable_endpoint.endpoint) ON CONFLICT (endpoint) DO NOTHING;
    SELECT * INTO e FROM pgdispatch.endpoints x WHERE x.endpoint = disable_endpoint.endpoint FOR UPDATE;
    UPDATE pgdispatch.endpoints x
    SET note = coalesce(nullif(disable_endpoint.note, ''), x.note),
        disabled_at = coalesce(x.disabled_at, now()), disabled_by = coalesce(x.disabled_by, 'operator'),
        probe_until = CASE WHEN x.disabled_at IS NULL THEN NULL ELSE x.probe_until END,
        state = CASE WHEN x.disabled_at IS NULL AND x.state = 'half_open' THEN 'open' ELSE x.state END,
        updated_at = now()
    WHERE x.endpoint = e.endpoint;
    IF e.disabled_at IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pgdispatch.endpoint_event(e.endpoint, 'disabled', 'operator', e.reason, nullif(disable_endpoint.note, ''),
                                       event_kind, event_queue, event_payload);
    RETURN true;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.dispatch_event()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
    INSERT INTO pgdispatch.jobs (kind, queue, payload, traceparent, tracestate, flow_key)
    VALUES (job_kind, job_queue, pg_catalog.jsonb_set(job_payload, ARRAY[field], envelope), parent, state, key);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.enable_endpoint(endpoint text, event_kind text DEFAULT NULL::text, event_queue text DEFAULT NULL::text, event_payload jsonb DEFAULT NULL::jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    e pgdispatch.endpoints;
BEGIN
    PERFORM pgdispatch.check_endpoint(enable_endpoint.endpoint);
    UPDATE pgdispatch.endpoints x
    SET disabled_at = NULL, disabled_by = NULL, state = 'closed', attempts = 0, failures = 0,
        window_started_at = now(), opened_at = NULL, open_until = NULL, cool_down = NULL, probe_until = NULL,
        updated_at = now()
    WHERE x.endpoint = enable_endpoint.endpoint AND x.disabled_at IS NOT NULL
    RETURNING * INTO e;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgdispatch.endpoint_event(e.endpoint, 'enabled', 'operator', NULL, e.note, event_kind, event_queue, event_payload);
    RETURN true;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.endpoint_event(endpoint text, event text, actor text, reason text, note text, job_kind text, job_queue text, job_payload jsonb)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET "pgdispatch.firing" TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    ev      pgdispatch.endpoint_events;
    body    jsonb;
    payload jsonb := coalesce(job_payload, '{}');
    field   text;
    job     bigint;
BEGIN
    INSERT INTO pgdispatch.endpoint_events AS x (endpoint, event, actor, reason, note)
    VALUES (endpoint_event.endpoint, endpoint_event.event, endpoint_event.actor,
            pg_catalog.left(endpoint_event.reason, 300), endpoint_event.note)
    RETURNING * INTO ev;
    IF job_kind IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(payload) <> 'object' THEN
            RAISE EXCEPTION 'endpoint_event: the job''s payload must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        body := pg_catalog.jsonb_build_object('event_id', ev.id, 'endpoint', ev.endpoint, 'event', ev.event, 'at', ev.at,
                                              'by', ev.actor, 'reason', ev.reason, 'note', ev.note);
        field := CASE job_kind WHEN 'http_callback' THEN 'data' WHEN 'rabbitmq' THEN 'body' END;
        IF field IS NULL THEN
            payload := payload || body;
        ELSE
            IF pg_catalog.jsonb_typeof(payload -> field) = 'object' THEN
                body := (payload -> field) || body;
            END IF;
            payload := pg_catalog.jsonb_set(payload, ARRAY[field], body);
        END IF;
        INSERT INTO pgdispatch.jobs AS j (kind, queue, payload)
        VALUES (job_kind, coalesce(job_queue, 'default'), payload)
        RETURNING j.id INTO job;
        UPDATE pgdispatch.endpoint_events x SET job_id = job WHERE x.id = ev.id;
    END IF;
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', E'pgdispatch', 'endpoints', true, 'endpoint', ev.endpoint)::text);
    RETURN ev.id;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.enqueue(kind text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT 'default'::text, run_at timestamp with time zone DEFAULT now(), priority smallint DEFAULT 0, dedup_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, flow_key text DEFAULT NULL::text)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET "pgdispatch.firing" TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO pgdispatch.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts,
                                       traceparent, tracestate, flow_key)
    VALUES (enqueue.kind, coalesce(enqueue.payload, '{}'), coalesce(enqueue.queue, 'default'),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.priority, 0), enqueue.dedup_key,
            enqueue.max_attempts, enqueue.traceparent, enqueue.tracestate, enqueue.flow_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO job_id;
    IF job_id IS NULL THEN
        SELECT e.id INTO job_id
        FROM pgdispatch.enqueue_checked(enqueue.kind, enqueue.payload, enqueue.queue, enqueue.run_at,
                                         enqueue.priority, enqueue.dedup_key, enqueue.max_attempts,
                                         enqueue.traceparent, enqueue.tracestate, enqueue.flow_key) e;
    END IF;
    RETURN job_id;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.enqueue_checked(kind text, payload jsonb DEFAULT '{}'::jsonb, queue text DEFAULT 'default'::text, run_at timestamp with time zone DEFAULT now(), priority smallint DEFAULT 0, dedup_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, flow_key text DEFAULT NULL::text, OUT id bigint, OUT created boolean, OUT conflict boolean)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET "pgdispatch.firing" TO 'off'
AS $function$
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
        INSERT INTO pgdispatch.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts,
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
        FROM pgdispatch.jobs j
        WHERE j.dedup_key = enqueue_checked.dedup_key;
        IF id IS NOT NULL THEN
            created := false;
            IF holder_by = caller OR has_table_privilege(session_user, format('%I.jobs', E'pgdispatch'), 'SELECT') THEN
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
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.fire_schedule_slots(ids bigint[], slots timestamp with time zone[])
 RETURNS TABLE(schedule_id bigint, created bigint, taken bigint, taken_key text, taken_by bigint)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET "pgdispatch.firing" TO 'on'
AS $function$
    WITH wanted AS (
        SELECT f.n, s.id, f.slot, s.kind, s.payload, s.queue, s.priority, s.max_attempts,
               'schedule:' || s.name || ':' || to_char(f.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS key
        FROM unnest(fire_schedule_slots.ids, fire_schedule_slots.slots) WITH ORDINALITY AS f(id, slot, n)
        JOIN pgdispatch.schedules s ON s.id = f.id
        WHERE s.enabled
    ), inserted AS (
        INSERT INTO pgdispatch.jobs (kind, payload, queue, priority, max_attempts, run_at, dedup_key)
        SELECT w.kind, w.payload, w.queue, w.priority, w.max_attempts, w.slot, w.key
        FROM wanted w
        ORDER BY w.n
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING dedup_key
    ), outcome AS (
        -- Within a schedule, the keys sort as their slots do.
        SELECT w.id, count(i.dedup_key) AS created, count(*) FILTER (WHERE i.dedup_key IS NULL) AS taken,
               max(w.key) FILTER (WHERE i.dedup_key IS NULL) AS taken_key
        FROM wanted w LEFT JOIN inserted i ON i.dedup_key = w.key
        GROUP BY w.id
    )
    -- The statement's snapshot shows the jobs that held keys before it.
    SELECT o.id, o.created, o.taken, o.taken_key, j.id
    FROM outcome o LEFT JOIN pgdispatch.jobs j ON j.dedup_key = o.taken_key
    ORDER BY o.id
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.flow_ended(queues text[])
 RETURNS void
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT pg_catalog.pg_notify(E'pgdispatch', q.name)
    FROM pgdispatch.queues q
    WHERE q.name = ANY(flow_ended.queues) AND q.limited
      AND NOT pg_catalog.pg_try_advisory_xact_lock_shared(1922186763, pg_catalog.hashtext(q.name))
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.flow_limits_changed()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    names text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(DISTINCT n.queue ORDER BY n.queue) INTO names FROM new_rows n;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(DISTINCT x.queue ORDER BY x.queue) INTO names
        FROM (SELECT n.queue FROM new_rows n UNION SELECT o.queue FROM old_rows o) x;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(DISTINCT o.queue ORDER BY o.queue) INTO names FROM old_rows o;
    ELSE
        SELECT array_agg(q.name ORDER BY q.name) INTO names FROM pgdispatch.queues q WHERE q.limited;
    END IF;
    IF names IS NULL THEN
        RETURN NULL;
    END IF;

    INSERT INTO pgdispatch.queues AS q (name)
    SELECT n.name FROM pg_catalog.unnest(names) n(name) ORDER BY n.name
    ON CONFLICT (name) DO NOTHING;
    PERFORM FROM pgdispatch.queues q WHERE q.name = ANY(names) ORDER BY q.name FOR UPDATE;
    UPDATE pgdispatch.queues q
    SET limited = l.has, updated_at = CASE WHEN q.limited IS DISTINCT FROM l.has THEN now() ELSE q.updated_at END
    FROM (SELECT n.name, EXISTS (SELECT FROM pgdispatch.flow_limits f WHERE f.queue = n.name) AS has
          FROM pg_catalog.unnest(names) n(name)) l
    WHERE q.name = l.name;
    PERFORM pg_catalog.pg_notify(E'pgdispatch', n.name) FROM pg_catalog.unnest(names) n(name);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.insert_scheduled_jobs(ids bigint[], slots timestamp with time zone[])
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce(sum(f.created), 0)::bigint
    FROM pgdispatch.fire_schedule_slots(insert_scheduled_jobs.ids, insert_scheduled_jobs.slots) f
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.notify_schedules()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        jsonb_build_object('schema', E'pgdispatch', 'schedules', true)::text);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.notify_sleeper()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.status = 'pending'
       AND pg_catalog.char_length(NEW.queue) <= 128
       AND pg_catalog.current_setting('pgdispatch.notified', true)
           IS DISTINCT FROM pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue)
       AND pg_catalog.current_setting('pgdispatch.notify', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA, NEW.queue),
                pg_catalog.set_config('pgdispatch.notified',
                                      pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue), true);
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.pause_queue(queue text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    was_paused timestamptz;
BEGIN
    SELECT q.paused_at INTO was_paused FROM pgdispatch.queues q WHERE q.name = pause_queue.queue FOR UPDATE;
    IF was_paused IS NOT NULL THEN
        RETURN false;
    END IF;
    INSERT INTO pgdispatch.queues AS q (name, paused_at) VALUES (pause_queue.queue, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = now(), updated_at = now();
    RETURN true;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.pause_schedule(name text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT EXISTS (SELECT FROM pgdispatch.schedules s WHERE s.name = pause_schedule.name) THEN
        RAISE EXCEPTION 'no schedule is called %', pause_schedule.name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE pgdispatch.schedules s SET enabled = false WHERE s.name = pause_schedule.name AND s.enabled;
    RETURN FOUND;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.record_endpoint_outcomes(endpoints text[], attempts integer[], failures integer[], reasons text[], win interval, min_attempts integer, fail_ratio double precision, cool_down interval)
 RETURNS SETOF text
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT pgdispatch.record_endpoint_outcomes(endpoints, attempts, failures, reasons, win, min_attempts, fail_ratio,
                                                cool_down, NULL, NULL, NULL)
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.record_endpoint_outcomes(endpoints text[], attempts integer[], failures integer[], reasons text[], win interval, min_attempts integer, fail_ratio double precision, cool_down interval, event_kind text, event_queue text, event_payload jsonb)
 RETURNS SETOF text
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT pgdispatch.record_endpoint_outcomes(endpoints, attempts, failures, reasons, win, min_attempts, fail_ratio,
                                                cool_down, event_kind, event_queue, event_payload, NULL)
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.record_endpoint_outcomes(endpoints text[], attempts integer[], failures integer[], reasons text[], win interval, min_attempts integer, fail_ratio double precision, cool_down interval, event_kind text, event_queue text, event_payload jsonb, max_cool_down interval)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    i integer;
    e pgdispatch.endpoints;
BEGIN
    FOR i IN 1 .. coalesce(pg_catalog.array_length(record_endpoint_outcomes.endpoints, 1), 0) LOOP
        INSERT INTO pgdispatch.endpoints AS x (endpoint) VALUES (record_endpoint_outcomes.endpoints[i])
        ON CONFLICT (endpoint) DO NOTHING;
        SELECT * INTO e FROM pgdispatch.endpoints x WHERE x.endpoint = record_endpoint_outcomes.endpoints[i] FOR UPDATE;
        IF e.window_started_at <= now() - win THEN
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
        END IF;
        e.attempts := e.attempts + record_endpoint_outcomes.attempts[i];
        e.failures := e.failures + record_endpoint_outcomes.failures[i];
        IF record_endpoint_outcomes.failures[i] > 0 AND reasons[i] IS NOT NULL THEN
            e.reason := pg_catalog.left(reasons[i], 300);
        END IF;
        IF e.state = 'closed' AND e.disabled_at IS NULL
           AND e.attempts >= min_attempts AND e.failures >= fail_ratio * e.attempts THEN
            e.state := 'open';
            e.opened_at := now();
            IF e.cool_down_kept_until > now() AND e.cool_down IS NOT NULL THEN
                e.cool_down := least(greatest(e.cool_down, record_endpoint_outcomes.cool_down),
                                     coalesce(greatest(max_cool_down, record_endpoint_outcomes.cool_down), e.cool_down));
            ELSE
                e.cool_down := record_endpoint_outcomes.cool_down;
            END IF;
            e.cool_down_kept_until := NULL;
            e.open_until := now() + e.cool_down;
            e.attempts := 0;
            e.failures := 0;
            e.window_started_at := now();
            PERFORM pgdispatch.endpoint_event(e.endpoint, 'opened', 'breaker', e.reason, NULL,
                                               event_kind, event_queue, event_payload);
            RETURN NEXT e.endpoint;
        END IF;
        UPDATE pgdispatch.endpoints x
        SET state = e.state, attempts = e.attempts, failures = e.failures, window_started_at = e.window_started_at,
            opened_at = e.opened_at, open_until = e.open_until, cool_down = e.cool_down,
            cool_down_kept_until = e.cool_down_kept_until, reason = e.reason,
            updated_at = now()
        WHERE x.endpoint = e.endpoint;
    END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.remove_trigger(trigger_name text, lock_wait interval DEFAULT '00:00:01'::interval)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    t pgdispatch.event_triggers;
BEGIN
    SELECT * INTO t FROM pgdispatch.event_triggers e WHERE e.name = remove_trigger.trigger_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no pgdispatch trigger is named %', remove_trigger.trigger_name
            USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM set_config('lock_timeout', (extract(epoch FROM remove_trigger.lock_wait) * 1000)::bigint::text, true);
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.table_oid) THEN
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', t.name, t.table_oid::regclass);
    END IF;
    DELETE FROM pgdispatch.event_triggers e WHERE e.name = t.name;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.reserve_schedule_keys()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    firer oid := (SELECT p.proowner FROM pg_catalog.pg_proc p
                  WHERE p.oid = pg_catalog.to_regprocedure(
                      pg_catalog.format('%I.fire_schedule_slots(bigint[], timestamptz[])', TG_TABLE_SCHEMA)));
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.dedup_key IS NOT DISTINCT FROM OLD.dedup_key THEN
        RETURN NEW;
    END IF;
    IF pg_catalog.current_setting('pgdispatch.firing', true) IS DISTINCT FROM 'on'
       OR firer IS NULL OR NOT pg_catalog.pg_has_role(current_user, firer, 'USAGE') THEN
        RAISE EXCEPTION 'dedup_key "%" is reserved for the schedules'' jobs', NEW.dedup_key
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'A dedup_key that begins with schedule: names a slot of a schedule; only the workers create its job.',
                  HINT = 'Give the job a dedup_key of another form, or declare a schedule to create a job at each slot.';
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.restart_schedule()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NEW.updated_at = now() AND NEW.next_run_at IS NULL THEN
        NEW.updated_at := clock_timestamp();
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.resume_queue(queue text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    UPDATE pgdispatch.queues q SET paused_at = NULL, updated_at = now()
    WHERE q.name = resume_queue.queue AND q.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.pg_notify(E'pgdispatch', resume_queue.queue);
    RETURN true;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.resume_schedule(name text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT EXISTS (SELECT FROM pgdispatch.schedules s WHERE s.name = resume_schedule.name) THEN
        RAISE EXCEPTION 'no schedule is called %', resume_schedule.name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE pgdispatch.schedules s SET enabled = true WHERE s.name = resume_schedule.name AND NOT s.enabled;
    RETURN FOUND;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.rotate_signing_secret(secret bytea, overlap interval)
 RETURNS TABLE(id bigint, others_expire_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    new_id bigint;
    t      timestamptz;
    ends   timestamptz;
BEGIN
    IF overlap IS NULL OR overlap < interval '0' THEN
        RAISE EXCEPTION 'rotate_signing_secret: the overlap must be zero or more, not %', overlap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext(E'pgdispatch' || '.signing_secrets'));
    -- The time once the lock is held, not the transaction's start: a
    -- rotation that committed while this one waited made its secret
    -- after this transaction began, and an end is never before a
    -- secret was made (nor is a secret deleted before it ends).
    t := pg_catalog.clock_timestamp();
    ends := t + overlap;
    PERFORM FROM pgdispatch.signing_secrets s ORDER BY s.id FOR UPDATE;
    DELETE FROM pgdispatch.signing_secrets s WHERE s.expires_at <= t;
    UPDATE pgdispatch.signing_secrets s SET expires_at = greatest(ends, s.created_at)
    WHERE s.expires_at IS NULL OR s.expires_at > ends;
    SELECT max(s.expires_at) INTO ends FROM pgdispatch.signing_secrets s WHERE s.expires_at > t;
    INSERT INTO pgdispatch.signing_secrets AS s (secret) VALUES (rotate_signing_secret.secret)
    RETURNING s.id INTO new_id;
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', E'pgdispatch', 'secrets', true)::text);
    RETURN QUERY SELECT new_id, ends;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.schedule(name text, cron text, kind text, payload jsonb DEFAULT NULL::jsonb, queue text DEFAULT NULL::text, time_zone text DEFAULT NULL::text, priority smallint DEFAULT NULL::smallint, max_attempts integer DEFAULT NULL::integer, catch_up text DEFAULT NULL::text, catch_up_limit integer DEFAULT NULL::integer, every interval DEFAULT NULL::interval, enabled boolean DEFAULT NULL::boolean, OUT id bigint, OUT created boolean)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF schedule.kind IS NOT NULL
       AND schedule.kind NOT IN ('http_callback', 'rabbitmq', 'email', 'noop') THEN
        RAISE NOTICE 'pgdispatch: schedule %: kind % is none of pgdispatch''s executors (http_callback, rabbitmq, email, noop)', schedule.name, schedule.kind
            USING HINT = 'A worker must have an executor registered for it, or its jobs die.';
    END IF;
    INSERT INTO pgdispatch.schedules AS s
        (name, cron, every, time_zone, kind, payload, queue, priority, max_attempts, catch_up, catch_up_limit, enabled)
    VALUES (schedule.name, schedule.cron, schedule.every, coalesce(schedule.time_zone, 'UTC'), schedule.kind,
            coalesce(schedule.payload, '{}'), coalesce(schedule.queue, 'default'), coalesce(schedule.priority, 0),
            schedule.max_attempts, coalesce(schedule.catch_up, 'skip'), coalesce(schedule.catch_up_limit, 100),
            coalesce(schedule.enabled, true))
    ON CONFLICT (name) DO UPDATE SET
        cron           = CASE WHEN schedule.cron IS NOT NULL OR schedule.every IS NOT NULL THEN schedule.cron ELSE s.cron END,
        every          = CASE WHEN schedule.cron IS NOT NULL OR schedule.every IS NOT NULL THEN schedule.every ELSE s.every END,
        time_zone      = coalesce(schedule.time_zone, s.time_zone),
        kind           = coalesce(schedule.kind, s.kind),
        payload        = coalesce(schedule.payload, s.payload),
        queue          = coalesce(schedule.queue, s.queue),
        priority       = coalesce(schedule.priority, s.priority),
        max_attempts   = coalesce(schedule.max_attempts, s.max_attempts),
        catch_up       = coalesce(schedule.catch_up, s.catch_up),
        catch_up_limit = coalesce(schedule.catch_up_limit, s.catch_up_limit),
        enabled        = coalesce(schedule.enabled, s.enabled)
    RETURNING s.id, s.xmax = 0 INTO id, created;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.set_endpoint_note(endpoint text, note text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM pgdispatch.check_endpoint(set_endpoint_note.endpoint);
    INSERT INTO pgdispatch.endpoints AS x (endpoint, note)
    VALUES (set_endpoint_note.endpoint, nullif(set_endpoint_note.note, ''))
    ON CONFLICT (endpoint) DO UPDATE SET note = excluded.note, updated_at = now();
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        pg_catalog.jsonb_build_object('schema', E'pgdispatch', 'endpoints', true, 'endpoint', set_endpoint_note.endpoint)::text);
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.set_flow_limit(queue text, key text DEFAULT NULL::text, concurrency integer DEFAULT NULL::integer, strict boolean DEFAULT false, rate integer DEFAULT NULL::integer, per interval DEFAULT NULL::interval)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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

    INSERT INTO pgdispatch.flow_limits AS l (queue, key, concurrency, strict, rate, per)
    VALUES (set_flow_limit.queue, set_flow_limit.key, set_flow_limit.concurrency,
            coalesce(set_flow_limit.strict, false), set_flow_limit.rate, set_flow_limit.per)
    ON CONFLICT (queue, coalesce(key, ''))
    DO UPDATE SET concurrency = EXCLUDED.concurrency, strict = EXCLUDED.strict, rate = EXCLUDED.rate,
                  per = EXCLUDED.per, updated_at = now();
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.snooze(id bigint, delay interval)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF delay IS NULL OR delay < interval '0' THEN
        RAISE EXCEPTION 'snooze: the delay must be zero or more, not %', delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pgdispatch.jobs j SET run_at = now() + snooze.delay, updated_at = now()
    WHERE j.id = snooze.id AND j.status = 'pending';
    RETURN FOUND;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.unschedule(name text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    DELETE FROM pgdispatch.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$function$;

CREATE OR REPLACE FUNCTION pgdispatch.wake(queue text DEFAULT 'default'::text)
 RETURNS void
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$ SELECT pg_catalog.pg_notify(E'pgdispatch', queue) $function$;

-- Triggers

CREATE TRIGGER flow_limits_deleted AFTER DELETE ON pgdispatch.flow_limits REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION pgdispatch.flow_limits_changed();

CREATE TRIGGER flow_limits_inserted AFTER INSERT ON pgdispatch.flow_limits REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pgdispatch.flow_limits_changed();

CREATE TRIGGER flow_limits_truncated AFTER TRUNCATE ON pgdispatch.flow_limits FOR EACH STATEMENT EXECUTE FUNCTION pgdispatch.flow_limits_changed();

CREATE TRIGGER flow_limits_updated AFTER UPDATE ON pgdispatch.flow_limits REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pgdispatch.flow_limits_changed();

CREATE TRIGGER jobs_notify_insert BEFORE INSERT ON pgdispatch.jobs FOR EACH ROW WHEN (NOT pg_try_advisory_xact_lock_shared(1922186763, hashtext(new.queue))) EXECUTE FUNCTION pgdispatch.notify_sleeper();

CREATE TRIGGER jobs_notify_update BEFORE UPDATE OF status, run_at, queue ON pgdispatch.jobs FOR EACH ROW WHEN (new.status = 'pending'::text AND (old.status IS DISTINCT FROM 'pending'::text OR old.run_at IS DISTINCT FROM new.run_at OR old.queue IS DISTINCT FROM new.queue) AND (new.run_at <= now() OR current_setting('pgdispatch.outcome'::text, true) IS DISTINCT FROM 'on'::text) AND NOT pg_try_advisory_xact_lock_shared(1922186763, hashtext(new.queue))) EXECUTE FUNCTION pgdispatch.notify_sleeper();

CREATE TRIGGER jobs_payload_size BEFORE INSERT OR UPDATE OF payload ON pgdispatch.jobs FOR EACH ROW WHEN (pg_column_size(new.payload) > 4096) EXECUTE FUNCTION pgdispatch.check_payload_size();

CREATE TRIGGER jobs_schedule_key BEFORE INSERT OR UPDATE OF dedup_key ON pgdispatch.jobs FOR EACH ROW WHEN (starts_with(new.dedup_key, 'schedule:'::text)) EXECUTE FUNCTION pgdispatch.reserve_schedule_keys();

CREATE TRIGGER schedules_check BEFORE INSERT OR UPDATE ON pgdispatch.schedules FOR EACH ROW WHEN (current_setting('pgdispatch.scheduling'::text, true) IS DISTINCT FROM 'on'::text) EXECUTE FUNCTION pgdispatch.check_schedule();

CREATE TRIGGER schedules_notify AFTER INSERT OR DELETE OR UPDATE ON pgdispatch.schedules FOR EACH STATEMENT WHEN (current_setting('pgdispatch.scheduling'::text, true) IS DISTINCT FROM 'on'::text) EXECUTE FUNCTION pgdispatch.notify_schedules();

CREATE TRIGGER schedules_payload_size BEFORE INSERT OR UPDATE OF payload ON pgdispatch.schedules FOR EACH ROW WHEN (pg_column_size(new.payload) > 4096) EXECUTE FUNCTION pgdispatch.check_payload_size();

CREATE TRIGGER schedules_restart BEFORE UPDATE ON pgdispatch.schedules FOR EACH ROW WHEN (current_setting('pgdispatch.scheduling'::text, true) IS DISTINCT FROM 'on'::text) EXECUTE FUNCTION pgdispatch.restart_schedule();

-- Event triggers
