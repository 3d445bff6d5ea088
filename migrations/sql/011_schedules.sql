-- Durable schedules: cron in a table.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal.
--
-- A schedule creates a job at each of its slots: the times its cron
-- expression names in its time zone, or the multiples of its interval
-- since 1970-01-01 00:00 UTC. Every worker runs a scheduler (package
-- schedule) that fires due schedules with FOR UPDATE SKIP LOCKED: in one
-- transaction it inserts the slot's job, whose dedup_key is
-- 'schedule:<name>:<slot, RFC 3339 in UTC>', and moves next_run_at on.
-- Workers compute the slots (robfig/cron's parser); this schema checks a
-- declaration as far as SQL can (the trigger below), and leaves
-- next_run_at NULL for the first worker to fill. A schedule a worker cannot
-- compute gets its reason in error and is left alone until it is changed.
--
-- Any change but a worker's own notifies the workers on the channel
-- pgdispatch.control ({"schema": ..., "schedules": true}), and they read
-- the earliest next_run_at again; otherwise they sleep until it.

CREATE TABLE IF NOT EXISTS {{.schema}}.schedules (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text        NOT NULL,
    cron           text,
    every          interval,
    time_zone      text        NOT NULL DEFAULT 'UTC',
    kind           text        NOT NULL,
    payload        jsonb       NOT NULL DEFAULT '{}',
    queue          text        NOT NULL DEFAULT 'default',
    priority       smallint    NOT NULL DEFAULT 0,
    max_attempts   integer,
    catch_up       text        NOT NULL DEFAULT 'skip',
    catch_up_limit integer     NOT NULL DEFAULT 100,
    enabled        boolean     NOT NULL DEFAULT true,
    next_run_at    timestamptz,
    last_run_at    timestamptz,
    runs           bigint      NOT NULL DEFAULT 0,
    missed         bigint      NOT NULL DEFAULT 0,
    caught_up      bigint      NOT NULL DEFAULT 0,
    error          text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_name_key UNIQUE (name),
    CONSTRAINT schedules_name_check CHECK (char_length(name) BETWEEN 1 AND 200),
    CONSTRAINT schedules_timing_check CHECK (num_nonnulls(cron, every) = 1),
    CONSTRAINT schedules_kind_check CHECK (char_length(kind) BETWEEN 1 AND 128),
    CONSTRAINT schedules_queue_check CHECK (char_length(queue) BETWEEN 1 AND 128),
    CONSTRAINT schedules_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000000),
    CONSTRAINT schedules_catch_up_check CHECK (catch_up IN ('skip', 'all')),
    CONSTRAINT schedules_catch_up_limit_check CHECK (catch_up_limit BETWEEN 1 AND 1000),
    CONSTRAINT schedules_payload_size_check CHECK (pg_column_size(payload) <= 1048576),
    CONSTRAINT schedules_next_run_at_check
        CHECK (next_run_at >= '0001-01-01 00:00:00+00' AND next_run_at < '9999-01-01 00:00:00+00')
);

COMMENT ON TABLE {{.schema}}.schedules IS
    'durable schedules: each creates a job of kind at every slot of cron (in time_zone) or every';
COMMENT ON COLUMN {{.schema}}.schedules.next_run_at IS
    'the next slot; NULL until a worker computes it (after a declaration, a change of timing or a resume)';
COMMENT ON COLUMN {{.schema}}.schedules.error IS
    'why the workers leave the schedule alone (set by a worker; cleared by any change of its definition)';

-- The scheduler's look for due schedules and for the earliest next slot.
CREATE INDEX IF NOT EXISTS schedules_next_run_idx ON {{.schema}}.schedules (next_run_at)
    WHERE enabled AND error IS NULL;

-- check_schedule refuses what SQL can tell is wrong with a declaration, as
-- clearly as it can, and starts the schedule afresh when its timing changes
-- or it is enabled again: next_run_at NULL, which the workers compute from
-- updated_at, so that slots while it was paused are not caught up. The
-- workers' own updates (pgdispatch.scheduling = on) skip it.
CREATE OR REPLACE FUNCTION {{.schema}}.check_schedule() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;

DROP TRIGGER IF EXISTS schedules_check ON {{.schema}}.schedules;
CREATE TRIGGER schedules_check
    BEFORE INSERT OR UPDATE ON {{.schema}}.schedules
    FOR EACH ROW
    WHEN (pg_catalog.current_setting('pgdispatch.scheduling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {{.schema}}.check_schedule();

-- notify_schedules tells every worker to read the schedules again.
CREATE OR REPLACE FUNCTION {{.schema}}.notify_schedules() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('pgdispatch.control',
        jsonb_build_object('schema', {{.schema_literal}}, 'schedules', true)::text);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS schedules_notify ON {{.schema}}.schedules;
CREATE TRIGGER schedules_notify
    AFTER INSERT OR UPDATE OR DELETE ON {{.schema}}.schedules
    FOR EACH STATEMENT
    WHEN (pg_catalog.current_setting('pgdispatch.scheduling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {{.schema}}.notify_schedules();

-- schedule declares the schedule called name, or changes it: the arguments
-- left NULL take their defaults for a new schedule and keep their values
-- for an existing one, except that a schedule has either cron or every.
-- A change of timing (cron, every, time_zone) starts the schedule afresh
-- from now; a declaration that changes nothing leaves it as it is. It
-- returns the schedule's id and whether it was created. The kind is not
-- checked against the workers' executors (SQL cannot see them): a kind
-- none of pgdispatch's own executors runs raises a NOTICE.
CREATE OR REPLACE FUNCTION {{.schema}}.schedule(
    name           text,
    cron           text,
    kind           text,
    payload        jsonb    DEFAULT NULL,
    queue          text     DEFAULT NULL,
    time_zone      text     DEFAULT NULL,
    priority       smallint DEFAULT NULL,
    max_attempts   integer  DEFAULT NULL,
    catch_up       text     DEFAULT NULL,
    catch_up_limit integer  DEFAULT NULL,
    every          interval DEFAULT NULL,
    enabled        boolean  DEFAULT NULL,
    OUT id         bigint,
    OUT created    boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF schedule.kind IS NOT NULL
       AND schedule.kind NOT IN ('http_callback', 'rabbitmq', 'email', 'noop') THEN
        RAISE NOTICE 'pgdispatch: schedule %: kind % is none of pgdispatch''s executors (http_callback, rabbitmq, email, noop)', schedule.name, schedule.kind
            USING HINT = 'A worker must have an executor registered for it, or its jobs die.';
    END IF;
    INSERT INTO {{.schema}}.schedules AS s
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
$$;

-- unschedule deletes the schedule called name; the jobs it created stay.
-- It reports whether there was one.
CREATE OR REPLACE FUNCTION {{.schema}}.unschedule(name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM {{.schema}}.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$$;

-- pause_schedule stops the schedule called name from creating jobs;
-- resume_schedule starts it again from the next slot after now (the slots
-- while it was paused are not caught up). Each reports whether it changed
-- the schedule, and raises an error when there is none of that name.
CREATE OR REPLACE FUNCTION {{.schema}}.pause_schedule(name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM {{.schema}}.schedules s WHERE s.name = pause_schedule.name) THEN
        RAISE EXCEPTION 'no schedule is called %', pause_schedule.name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE {{.schema}}.schedules s SET enabled = false WHERE s.name = pause_schedule.name AND s.enabled;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION {{.schema}}.resume_schedule(name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM {{.schema}}.schedules s WHERE s.name = resume_schedule.name) THEN
        RAISE EXCEPTION 'no schedule is called %', resume_schedule.name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE {{.schema}}.schedules s SET enabled = true WHERE s.name = resume_schedule.name AND NOT s.enabled;
    RETURN FOUND;
END
$$;

-- insert_scheduled_jobs creates the jobs of the slots a worker fires: for
-- each schedule id of ids, a job of that schedule at the slot of slots at
-- the same place, its dedup_key 'schedule:<name>:<slot, RFC 3339 in UTC>';
-- a slot whose key a job holds already gets none, and a paused schedule
-- none. It returns how many jobs
-- it created. It runs with its owner's rights, so that a worker may create
-- the jobs its schedules describe and insert no others.
CREATE OR REPLACE FUNCTION {{.schema}}.insert_scheduled_jobs(ids bigint[], slots timestamptz[]) RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH created AS (
        INSERT INTO {{.schema}}.jobs (kind, payload, queue, priority, max_attempts, run_at, dedup_key)
        SELECT s.kind, s.payload, s.queue, s.priority, s.max_attempts, f.slot,
               'schedule:' || s.name || ':' || to_char(f.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
        FROM unnest(insert_scheduled_jobs.ids, insert_scheduled_jobs.slots) WITH ORDINALITY AS f(id, slot, n)
        JOIN {{.schema}}.schedules s ON s.id = f.id
        WHERE s.enabled
        ORDER BY f.n
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM created
$$;

REVOKE ALL ON FUNCTION {{.schema}}.insert_scheduled_jobs(bigint[], timestamptz[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.schedule(text, text, text, jsonb, text, text, smallint, integer, text, integer, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.unschedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.pause_schedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.resume_schedule(text) FROM PUBLIC;
