-- A lighter WHEN for the wake-up triggers of migration 003.
-- {{.schema}} is the schema identifier and {{.sleep_key_prefix}} the string
-- literal '<schema>/', both already quoted by the migrator.
--
-- PostgreSQL prepares a trigger's WHEN anew for every statement that fires
-- it, so a writer inserting one row per statement pays for every node of
-- the expression, not only for the ones it evaluates. Measured in the server
-- (a procedure inserting and committing 20,000 single rows, six rounds),
-- the WHEN of migration 003 cost 13 µs an insert over no trigger; the key
-- test alone costs 6 µs. The rest moves into the function, which runs only
-- when the try fails, that is while a worker sleeps:
--   - the status test (a row inserted as done or dead takes the shared key,
--     which costs nothing more);
--   - the test that the transaction has notified the queue already, which
--     keeps a bulk insert from notifying once per row. It now costs such an
--     insert a function call per row while a worker sleeps: 100,000 rows in
--     one INSERT took 887 ms, against 755 ms before and 700 ms with no
--     trigger.
-- The key is the same as before, so workers of the previous release, which
-- take it when they sleep, are still notified during a rolling upgrade.

CREATE OR REPLACE FUNCTION {{.schema}}.notify_sleeper() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.status = 'pending'
       AND pg_catalog.current_setting('pgdispatch.notified', true)
           IS DISTINCT FROM pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue) THEN
        PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA, NEW.queue),
                pg_catalog.set_config('pgdispatch.notified',
                                      pg_catalog.concat(TG_TABLE_SCHEMA, '/', NEW.queue), true);
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_notify_insert ON {{.schema}}.jobs;
CREATE TRIGGER jobs_notify_insert
    BEFORE INSERT ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext({{.sleep_key_prefix}} || NEW.queue)))
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();

-- The claimer's own updates (to running, done or dead) still fail the first
-- test, evaluated per row, and never try the key.
DROP TRIGGER IF EXISTS jobs_notify_update ON {{.schema}}.jobs;
CREATE TRIGGER jobs_notify_update
    BEFORE UPDATE OF status, run_at ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND (OLD.status IS DISTINCT FROM 'pending' OR OLD.run_at IS DISTINCT FROM NEW.run_at)
          AND NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext({{.sleep_key_prefix}} || NEW.queue)))
    EXECUTE FUNCTION {{.schema}}.notify_sleeper();
