---- tern: disable-tx ----
-- Limits on what a writer can put in a row, and an enqueue() that a role
-- allowed only to enqueue can call.
-- {{.schema}} is the schema identifier and {{.schema_literal}} its name as a
-- string literal, both already quoted by the migrator.
--
-- Any writer of the jobs table describes work the worker does, so every
-- column a writer sets is untrusted. The constraints refuse, at INSERT and
-- with a constraint name that says which column, what a claim, the sweeper
-- or an admin command could not handle:
--   - attempts and max_attempts above 1,000,000. A claim adds one to
--     attempts and a retry to max_attempts: at 2^31-1 either overflows,
--     and the claim of the row's whole queue, or the retry of a whole
--     batch, fails with "integer out of range". Whatever writes them keeps
--     to the bound: a claim counts least(attempts + 1, 1000000), a retry
--     raises max_attempts to the bound at most;
--   - run_at outside [0001-01-01, 9999-01-01) UTC. The claim copes with any
--     finite time, but Go's JSON (jobs list --json) writes only the years 0
--     to 9999, and Python's datetime 1 to 9999: the upper bound leaves a
--     time zone's worth of margin, and the lower one is Go's zero time,
--     which writers send for "now". Finite, as migration 005 required;
--   - a queue or kind of more than 128 characters. The wake-up trigger
--     sends the queue's name as the NOTIFY payload, which PostgreSQL caps at
--     8000 bytes with an obscure error; and names this long are not names;
--   - a dedup_key of more than 512 characters: at most 2048 bytes, under the
--     2704 bytes a row of its unique index may hold;
--   - a payload of more than 1 MiB (pg_column_size, the jsonb's own size).
--     A claim loads up to CONCURRENCY payloads at once, so the bound keeps
--     a worker's memory to about CONCURRENCY MiB of payloads (100 MiB at the
--     default); 8 payloads of 40 MB take a worker past 1 GB. Webhook
--     bodies, messages and mails of more are better stored elsewhere and
--     referred to.
--
-- pg_column_size sees the datum as it is stored. A value the INSERT builds
-- is uncompressed, but one read from a table (INSERT ... SELECT, from a
-- temporary table of the writer's own) can still be compressed: 40 MB of
-- repeated text read 457,897 bytes. The trigger below measures those; the
-- CHECK cannot, because it runs at every UPDATE of the row too (every claim
-- and completion), where the stored payload is compressed and decompressing
-- it would cost each of them. PostgreSQL's TOAST compression (pglz, lz4)
-- shrinks data at most about 255 times, so no payload stored in 4096 bytes
-- or fewer can be over the limit once decompressed.
--
-- The limits are the migrations package's AttemptsLimit, PayloadLimit,
-- NameLimit and DedupKeyLimit, and its RunAtMin and RunAtEnd.
--
-- Cost: PostgreSQL prepares a table's constraints, like a trigger's WHEN,
-- for every statement that writes it. Measured in the server (a procedure
-- inserting rows one a statement, 2,000 a round, 40 rounds alternating with
-- a schema of version 7, the fastest round of each): 35-36 µs an insert at
-- version 7, 46-47 µs with this migration, of which the payload trigger's
-- WHEN is about 2 µs. Each condition costs 1.5-3.5 µs, mostly to prepare.
-- A client's insert and commit take hundreds of µs more; statements that
-- write many rows (claims, completions, sweeps) pay it once.
--
-- The migration runs each statement in a transaction of its own, so that
-- the table is never locked for longer than a catalog change: the
-- constraints are added NOT VALID (new and changed rows are checked from
-- then on), the rows that break them are repaired while writers go on, and
-- VALIDATE scans the table under a lock that lets writes through. Every
-- statement can run again, should the migration stop half way.

ALTER TABLE {{.schema}}.jobs
    DROP CONSTRAINT IF EXISTS jobs_attempts_check,
    ADD CONSTRAINT jobs_attempts_check CHECK (attempts BETWEEN 0 AND 1000000) NOT VALID,
    -- NULL passes a CHECK: the worker's MAX_ATTEMPTS applies.
    DROP CONSTRAINT IF EXISTS jobs_max_attempts_check,
    ADD CONSTRAINT jobs_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000000) NOT VALID,
    DROP CONSTRAINT IF EXISTS jobs_kind_check,
    ADD CONSTRAINT jobs_kind_check CHECK (char_length(kind) BETWEEN 1 AND 128) NOT VALID,
    DROP CONSTRAINT IF EXISTS jobs_queue_check,
    ADD CONSTRAINT jobs_queue_check CHECK (char_length(queue) BETWEEN 1 AND 128) NOT VALID,
    DROP CONSTRAINT IF EXISTS jobs_run_at_check,
    ADD CONSTRAINT jobs_run_at_check
        CHECK (run_at >= '0001-01-01 00:00:00+00' AND run_at < '9999-01-01 00:00:00+00') NOT VALID,
    DROP CONSTRAINT IF EXISTS jobs_dedup_key_check,
    ADD CONSTRAINT jobs_dedup_key_check CHECK (char_length(dedup_key) <= 512) NOT VALID,
    DROP CONSTRAINT IF EXISTS jobs_payload_size_check,
    ADD CONSTRAINT jobs_payload_size_check CHECK (pg_column_size(payload) <= 1048576) NOT VALID;

COMMENT ON CONSTRAINT jobs_attempts_check ON {{.schema}}.jobs IS
    'attempts between 0 and 1000000: the claim never counts past it';
COMMENT ON CONSTRAINT jobs_max_attempts_check ON {{.schema}}.jobs IS
    'max_attempts NULL (the worker''s MAX_ATTEMPTS) or between 1 and 1000000';
COMMENT ON CONSTRAINT jobs_kind_check ON {{.schema}}.jobs IS 'kind of 1 to 128 characters';
COMMENT ON CONSTRAINT jobs_queue_check ON {{.schema}}.jobs IS
    'queue of 1 to 128 characters: the wake-up NOTIFY carries it';
COMMENT ON CONSTRAINT jobs_run_at_check ON {{.schema}}.jobs IS
    'run_at from 0001-01-01 to before 9999-01-01 UTC, the years clients can represent';
COMMENT ON CONSTRAINT jobs_dedup_key_check ON {{.schema}}.jobs IS
    'dedup_key of at most 512 characters, so that its unique index can hold it';
COMMENT ON CONSTRAINT jobs_payload_size_check ON {{.schema}}.jobs IS
    'payload of at most 1 MiB (pg_column_size); trigger jobs_payload_size measures compressed values';

-- The wake-up trigger runs before the constraints, and would send a long
-- queue's name to pg_notify, which refuses more than 8000 bytes with an
-- error that names no column. It leaves such a row to jobs_queue_check.
-- Otherwise as in migration 006.
CREATE OR REPLACE FUNCTION {{.schema}}.notify_sleeper() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.status = 'pending'
       AND pg_catalog.char_length(NEW.queue) <= 128
       AND pg_catalog.current_setting('pgdispatch.notified', true)
           IS DISTINCT FROM pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue) THEN
        PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA, NEW.queue),
                pg_catalog.set_config('pgdispatch.notified',
                                      pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue), true);
    END IF;
    RETURN NEW;
END
$$;

-- Compressed payloads, measured decompressed. Only INSERTs and UPDATEs that
-- set payload, and only payloads stored in more than 4096 bytes, call it.
CREATE OR REPLACE FUNCTION {{.schema}}.check_payload_size() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- || detoasts its operands: the size of the result is the decompressed
    -- size (an object joined with {} is itself).
    size integer := pg_column_size(NEW.payload || '{}'::jsonb);
BEGIN
    IF size > 1048576 THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "jobs_payload_size_check"', TG_TABLE_NAME
            USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  CONSTRAINT = 'jobs_payload_size_check',
                  DETAIL = format('The payload is %s bytes decompressed; the limit is 1048576 (1 MiB).', size);
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_payload_size ON {{.schema}}.jobs;
CREATE TRIGGER jobs_payload_size
    BEFORE INSERT OR UPDATE OF payload ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (pg_column_size(NEW.payload) > 4096)
    EXECUTE FUNCTION {{.schema}}.check_payload_size();

-- The rows that break a limit. A pending job that could never run as it
-- is (attempts past the bound, a run_at that never comes, a queue or kind
-- no name is, a payload over the limit) is dead, with the reason. Every row
-- is brought within the limits, so that no later UPDATE of it (a claim, a
-- retry, a cancel) fails: counts and times are clamped, names cut, an
-- over-long dedup_key dropped (no INSERT can use such a key any more), and
-- a payload over the limit replaced by a note. The decompressed size is
-- read for the jobs a claim would load, now or after a retry (pending, dead
-- and cancelled), and for every row repaired, whose payload the trigger
-- measures again. Rows are locked in id order, as by every multi-row write
-- of pgdispatch.
WITH l AS (
    SELECT id FROM {{.schema}}.jobs
    WHERE attempts > 1000000 OR max_attempts > 1000000
       OR run_at < '0001-01-01 00:00:00+00' OR run_at >= '9999-01-01 00:00:00+00'
       OR char_length(queue) > 128 OR char_length(kind) > 128 OR char_length(dedup_key) > 512
       OR pg_column_size(payload) > 1048576
       OR (status IN ('pending', 'dead', 'cancelled')
           AND pg_column_size(payload) > 4096 AND pg_column_size(payload || '{}'::jsonb) > 1048576)
    ORDER BY id
    FOR UPDATE
), s AS (
    SELECT j.id, pg_column_size(j.payload || '{}'::jsonb) AS payload_size
    FROM {{.schema}}.jobs j JOIN l ON l.id = j.id
), r AS (
    SELECT j.id, s.payload_size > 1048576 AS big,
           nullif(concat_ws('; ',
               CASE WHEN j.attempts > 1000000 THEN format('attempts was %s', j.attempts) END,
               CASE WHEN j.run_at >= '9999-01-01 00:00:00+00' THEN format('run_at was %s, a time that never comes', j.run_at) END,
               CASE WHEN char_length(j.queue) > 128 THEN format('queue was %s characters long', char_length(j.queue)) END,
               CASE WHEN char_length(j.kind) > 128 THEN format('kind was %s characters long', char_length(j.kind)) END,
               CASE WHEN s.payload_size > 1048576 THEN format('payload was %s bytes', s.payload_size) END), '') AS reason
    FROM {{.schema}}.jobs j JOIN s ON s.id = j.id
)
UPDATE {{.schema}}.jobs j
SET status       = CASE WHEN j.status = 'pending' AND r.reason IS NOT NULL THEN 'dead' ELSE j.status END,
    finished_at  = CASE WHEN j.status = 'pending' AND r.reason IS NOT NULL THEN now() ELSE j.finished_at END,
    last_error   = CASE WHEN j.status = 'pending' AND r.reason IS NOT NULL
                        THEN r.reason || '; pgdispatch refuses such a job at INSERT since migration 008'
                        ELSE j.last_error END,
    attempts     = least(j.attempts, 1000000),
    max_attempts = CASE WHEN j.max_attempts > 1000000 THEN 1000000 ELSE j.max_attempts END,
    run_at       = CASE WHEN j.run_at < '0001-01-01 00:00:00+00' OR j.run_at >= '9999-01-01 00:00:00+00'
                        THEN now() ELSE j.run_at END,
    queue        = left(j.queue, 128),
    kind         = left(j.kind, 128),
    dedup_key    = CASE WHEN char_length(j.dedup_key) > 512 THEN NULL ELSE j.dedup_key END,
    payload      = CASE WHEN r.big
                        THEN jsonb_build_object('pgdispatch_payload_removed',
                                                'the payload was over the limit of 1 MiB (migration 008)')
                        ELSE j.payload END,
    updated_at   = now()
FROM r
WHERE j.id = r.id;

ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_attempts_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_max_attempts_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_kind_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_queue_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_run_at_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_dedup_key_check;
ALTER TABLE {{.schema}}.jobs VALIDATE CONSTRAINT jobs_payload_size_check;

-- enqueue_checked inserts a job as enqueue does, and says what happened:
-- created is false when a job already held dedup_key (id is then that
-- job's), and conflict is true when that job is not the one asked for: it
-- has another kind, queue, payload or priority, another max_attempts when
-- one is given, or it has not run yet and is due later than asked. A role
-- that may insert jobs may insert a key the application uses later, with
-- run_at in the year 9998 or a payload of its own; the application's job is
-- then never created, and this is how it can tell. A conflict also raises a
-- NOTICE, which plain enqueue() callers see.
--
-- It runs with its owner's rights (SECURITY DEFINER), so that a role
-- allowed only to enqueue (docs/roles.sql) need not read the table, and
-- it reveals nothing of the job holding the key but its id and whether it
-- equals the one asked for. The search_path is pinned and every name
-- qualified, so the caller's objects are never looked up.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_checked(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL,
    OUT id       bigint,
    OUT created  boolean,
    OUT conflict boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    want_payload  jsonb       := coalesce(enqueue_checked.payload, '{}');
    want_queue    text        := coalesce(enqueue_checked.queue, 'default');
    want_run_at   timestamptz := coalesce(enqueue_checked.run_at, now());
    want_priority smallint    := coalesce(enqueue_checked.priority, 0);
    differs       text;
BEGIN
    LOOP
        INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts)
        VALUES (enqueue_checked.kind, want_payload, want_queue, want_run_at, want_priority,
                enqueue_checked.dedup_key, enqueue_checked.max_attempts)
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING j.id INTO id;
        IF id IS NOT NULL THEN
            created := true;
            conflict := false;
            RETURN;
        END IF;

        SELECT j.id,
               concat_ws(', ',
                   CASE WHEN j.kind IS DISTINCT FROM enqueue_checked.kind THEN 'kind' END,
                   CASE WHEN j.queue IS DISTINCT FROM want_queue THEN 'queue' END,
                   CASE WHEN j.payload IS DISTINCT FROM want_payload THEN 'payload' END,
                   CASE WHEN j.priority IS DISTINCT FROM want_priority THEN 'priority' END,
                   CASE WHEN enqueue_checked.max_attempts IS NOT NULL
                             AND j.max_attempts IS DISTINCT FROM enqueue_checked.max_attempts THEN 'max_attempts' END,
                   CASE WHEN j.attempts = 0 AND j.run_at > want_run_at THEN 'a later run_at' END)
        INTO id, differs
        FROM {{.schema}}.jobs j
        WHERE j.dedup_key = enqueue_checked.dedup_key;
        IF id IS NOT NULL THEN
            created := false;
            conflict := differs <> '';
            IF conflict THEN
                RAISE NOTICE 'pgdispatch: dedup_key % is held by job %, which differs from the job asked for (%); no job was created',
                    enqueue_checked.dedup_key, id, differs
                    USING HINT = 'Another writer may have taken the key first. Look at that job: pgdispatch jobs show '
                                 || id || '.';
            END IF;
            RETURN;
        END IF;
        -- The holder of the key was deleted between the two statements: try again.
    END LOOP;
END
$$;

-- enqueue keeps its signature and result: the id of the job created, or of
-- the one that holds dedup_key. It inserts as before, and leaves a held key
-- to enqueue_checked, which finds the job and raises the NOTICE. (A SQL
-- function calling enqueue_checked is planned anew at every call: 72 µs an
-- enqueue against 51 µs so, measured as the constraints above.)
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     smallint    DEFAULT 0,
    dedup_key    text        DEFAULT NULL,
    max_attempts integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO {{.schema}}.jobs AS j (kind, payload, queue, run_at, priority, dedup_key, max_attempts)
    VALUES (enqueue.kind, coalesce(enqueue.payload, '{}'), coalesce(enqueue.queue, 'default'),
            coalesce(enqueue.run_at, now()), coalesce(enqueue.priority, 0), enqueue.dedup_key,
            enqueue.max_attempts)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO job_id;
    IF job_id IS NULL THEN
        SELECT e.id INTO job_id
        FROM {{.schema}}.enqueue_checked(enqueue.kind, enqueue.payload, enqueue.queue, enqueue.run_at,
                                         enqueue.priority, enqueue.dedup_key, enqueue.max_attempts) e;
    END IF;
    RETURN job_id;
END
$$;

-- A function PostgreSQL creates is executable by everyone, and a SECURITY
-- DEFINER one would let any role that can reach the schema create jobs.
-- EXECUTE goes to the roles that could insert into the table before, so
-- that every writer that called enqueue still can.
REVOKE ALL ON FUNCTION {{.schema}}.enqueue(text, jsonb, text, timestamptz, smallint, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer) FROM PUBLIC;

DO $$
DECLARE
    jobs    oid := (SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = {{.schema_literal}} AND c.relname = 'jobs');
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END
        FROM (SELECT c.relacl AS acl FROM pg_catalog.pg_class c WHERE c.oid = jobs
              UNION ALL
              SELECT t.attacl FROM pg_catalog.pg_attribute t WHERE t.attrelid = jobs AND t.attacl IS NOT NULL) x,
             pg_catalog.aclexplode(x.acl) a
        WHERE a.privilege_type = 'INSERT'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.enqueue(text, jsonb, text, timestamptz, smallint, text, integer), '
                                  '%I.enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer) TO %s',
                                  {{.schema_literal}}, {{.schema_literal}}, grantee);
    END LOOP;
END
$$;
