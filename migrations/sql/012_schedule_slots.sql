-- Schedules under failure and against hostile writers.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal.
--
-- 1. A schedule's slots are the schedule's. A job's dedup_key that begins
--    with schedule: names a slot ('schedule:<name>:<slot>', migration 011),
--    and a writer that could insert one ahead of the slot, with a payload
--    of its own, took the slot over: the schedule's insert met the key and
--    created nothing. Such keys are now reserved (the trigger
--    jobs_schedule_key): only fire_schedule_slots() writes them, as its
--    owner and under the setting pgdispatch.firing, which it sets for its
--    own run. A writer that sets the setting in its session is still not
--    the owner; enqueue() and enqueue_checked(), which run as the owner,
--    run with the setting off. A slot whose key a job holds anyway (one
--    inserted before this migration, or by the owner) creates no job, and
--    fire_schedule_slots() says so: the worker counts it in the schedule's
--    taken, not in runs, puts the key and the job that holds it in
--    warning, and logs it.
-- 2. A schedule starts afresh from the moment of the statement that
--    declares, resumes or retimes it (clock_timestamp()), not from the
--    start of its transaction (now()), whose slots would be caught up.
-- 3. The schedules table measures a payload that arrives compressed as the
--    jobs table does (migration 008): decompressed.

ALTER TABLE {{.schema}}.schedules
    ADD COLUMN IF NOT EXISTS taken bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS warning text,
    ALTER COLUMN updated_at SET DEFAULT clock_timestamp();

COMMENT ON COLUMN {{.schema}}.schedules.taken IS
    'slots that created no job because a job held their dedup_key already';
COMMENT ON COLUMN {{.schema}}.schedules.warning IS
    'the last slot that created no job, and the job that held its dedup_key (set by a worker)';

-- reserve_schedule_keys refuses a dedup_key of the schedules' unless
-- fire_schedule_slots() (or its owner, with pgdispatch.firing on) writes
-- it. Only rows whose key begins with schedule: call it.
CREATE OR REPLACE FUNCTION {{.schema}}.reserve_schedule_keys() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;

DROP TRIGGER IF EXISTS jobs_schedule_key ON {{.schema}}.jobs;
CREATE TRIGGER jobs_schedule_key
    BEFORE INSERT OR UPDATE OF dedup_key ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (pg_catalog.starts_with(NEW.dedup_key, 'schedule:'))
    EXECUTE FUNCTION {{.schema}}.reserve_schedule_keys();

-- enqueue() and enqueue_checked() run as the owner: with the setting off,
-- a caller that set it cannot write a schedule's key through them.
ALTER FUNCTION {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer)
    SET pgdispatch.firing = 'off';
ALTER FUNCTION {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer)
    SET pgdispatch.firing = 'off';

-- fire_schedule_slots creates the jobs of the slots a worker fires: for
-- each schedule id of ids, a job of that schedule at the slot of slots at
-- the same place, in that order, its dedup_key 'schedule:<name>:<slot, RFC
-- 3339 in UTC>'; a paused schedule gets none. It returns a row for each
-- enabled schedule of ids: the jobs created, the slots whose key a job held
-- already (taken, which create no job), the latest such key and the job
-- that holds it (NULL when that job is not yet committed). It runs with its
-- owner's rights, so that a worker may create the jobs its schedules
-- describe and no others.
CREATE OR REPLACE FUNCTION {{.schema}}.fire_schedule_slots(ids bigint[], slots timestamptz[])
RETURNS TABLE (schedule_id bigint, created bigint, taken bigint, taken_key text, taken_by bigint)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgdispatch.firing = 'on'
AS $$
    WITH wanted AS (
        SELECT f.n, s.id, f.slot, s.kind, s.payload, s.queue, s.priority, s.max_attempts,
               'schedule:' || s.name || ':' || to_char(f.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS key
        FROM unnest(fire_schedule_slots.ids, fire_schedule_slots.slots) WITH ORDINALITY AS f(id, slot, n)
        JOIN {{.schema}}.schedules s ON s.id = f.id
        WHERE s.enabled
    ), inserted AS (
        INSERT INTO {{.schema}}.jobs (kind, payload, queue, priority, max_attempts, run_at, dedup_key)
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
    FROM outcome o LEFT JOIN {{.schema}}.jobs j ON j.dedup_key = o.taken_key
    ORDER BY o.id
$$;

-- insert_scheduled_jobs, which workers of earlier builds call, fires as
-- fire_schedule_slots does and returns how many jobs it created.
CREATE OR REPLACE FUNCTION {{.schema}}.insert_scheduled_jobs(ids bigint[], slots timestamptz[]) RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(f.created), 0)::bigint
    FROM {{.schema}}.fire_schedule_slots(insert_scheduled_jobs.ids, insert_scheduled_jobs.slots) f
$$;

-- EXECUTE on fire_schedule_slots, and UPDATE of the new run state, go to
-- the roles that could fire schedules before: that held EXECUTE on
-- insert_scheduled_jobs, or UPDATE of runs.
REVOKE ALL ON FUNCTION {{.schema}}.fire_schedule_slots(bigint[], timestamptz[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.reserve_schedule_keys() FROM PUBLIC;

DO $$
DECLARE
    schedules oid := (SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = {{.schema_literal}} AND c.relname = 'schedules');
    grantee   text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = pg_catalog.to_regprocedure(pg_catalog.format('%I.insert_scheduled_jobs(bigint[], timestamptz[])', {{.schema_literal}}))
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.fire_schedule_slots(bigint[], timestamptz[]) TO %s',
                                  {{.schema_literal}}, grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
        FROM (SELECT c.relacl AS acl, c.relowner AS owner FROM pg_catalog.pg_class c WHERE c.oid = schedules
              UNION ALL
              SELECT t.attacl, c.relowner FROM pg_catalog.pg_attribute t JOIN pg_catalog.pg_class c ON c.oid = t.attrelid
              WHERE t.attrelid = schedules AND t.attname = 'runs' AND t.attacl IS NOT NULL) x,
             pg_catalog.aclexplode(x.acl) a
        WHERE a.privilege_type = 'UPDATE' AND a.grantee <> x.owner
    LOOP
        EXECUTE pg_catalog.format('GRANT UPDATE (taken, warning) ON %I.schedules TO %s', {{.schema_literal}}, grantee);
    END LOOP;
END
$$;

-- A change that starts a schedule afresh sets updated_at, from which the
-- workers compute its first slot, to now() (check_schedule, migration
-- 011): the start of the transaction. restart_schedule, which runs after
-- it, moves it to the statement's clock, so that a resume, a declaration
-- or a change of timing at the end of a long transaction does not catch
-- up the slots since the transaction began. (A new row's updated_at is
-- clock_timestamp() by default.)
CREATE OR REPLACE FUNCTION {{.schema}}.restart_schedule() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.updated_at = now() AND NEW.next_run_at IS NULL THEN
        NEW.updated_at := clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION {{.schema}}.restart_schedule() FROM PUBLIC;

-- Triggers of a kind fire in the order of their names: schedules_check,
-- then schedules_restart.
DROP TRIGGER IF EXISTS schedules_restart ON {{.schema}}.schedules;
CREATE TRIGGER schedules_restart
    BEFORE UPDATE ON {{.schema}}.schedules
    FOR EACH ROW
    WHEN (pg_catalog.current_setting('pgdispatch.scheduling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {{.schema}}.restart_schedule();

-- The payload check of migration 008 names the constraint of the table it
-- guards, and guards the schedules too: their payload becomes their jobs'.
CREATE OR REPLACE FUNCTION {{.schema}}.check_payload_size() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;

DROP TRIGGER IF EXISTS schedules_payload_size ON {{.schema}}.schedules;
CREATE TRIGGER schedules_payload_size
    BEFORE INSERT OR UPDATE OF payload ON {{.schema}}.schedules
    FOR EACH ROW
    WHEN (pg_column_size(NEW.payload) > 4096)
    EXECUTE FUNCTION {{.schema}}.check_payload_size();

COMMENT ON CONSTRAINT schedules_payload_size_check ON {{.schema}}.schedules IS
    'payload of at most 1 MiB (pg_column_size); trigger schedules_payload_size measures compressed values';
