-- Wake the sleeper of a job's new queue, and let a writer keep NOTIFY out of
-- its transaction.
-- {{.schema}} is the schema identifier, {{.schema_literal}} its name as a
-- string literal, and {{.sleep_key}} the schema's half of the sleep key
-- (migration 007).
--
-- A job moved to another queue (UPDATE ... SET queue) is a new job for that
-- queue: its sleeper is notified as for an insert.
--
-- A transaction that has sent NOTIFY cannot be prepared (PREPARE
-- TRANSACTION fails), and a trigger cannot tell that its transaction will
-- be. A writer that uses two-phase commit sets pgdispatch.notify to off for
-- its transaction, and after COMMIT PREPARED calls wake(queue), which sends
-- the NOTIFY the trigger left out. Otherwise notify_sleeper is as in
-- migration 008.

CREATE OR REPLACE FUNCTION {{.schema}}.notify_sleeper() RETURNS trigger
LANGUAGE plpgsql
AS $$
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
$$;

DROP TRIGGER IF EXISTS jobs_notify_update ON {{.schema}}.jobs;
CREATE TRIGGER jobs_notify_update
    BEFORE UPDATE OF status, run_at, queue ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND (OLD.status IS DISTINCT FROM 'pending' OR OLD.run_at IS DISTINCT FROM NEW.run_at
               OR OLD.queue IS DISTINCT FROM NEW.queue)
          AND NOT pg_try_advisory_xact_lock_shared({{.sleep_key}}, hashtext(NEW.queue)))
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();

-- wake notifies the workers of queue, as the trigger does: for a writer that
-- kept NOTIFY out of its transaction (pgdispatch.notify = off).
CREATE OR REPLACE FUNCTION {{.schema}}.wake(queue text DEFAULT 'default') RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_catalog.pg_notify({{.schema_literal}}, queue) $$;
