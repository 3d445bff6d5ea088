-- The NOTIFY triggers that wake workers.
-- {{.schema}} is the schema identifier, already quoted by the migrator.

-- Wake-ups. The channel is the schema name and the payload the queue name, so
-- that PostgreSQL folds the notifications of one transaction into one per queue.
-- Rows due within the horizon notify; a claimer that wakes for a row not yet due
-- learns its run_at and sleeps until then. Later rows are found by the fallback tick.
CREATE FUNCTION {{.schema}}.notify_inserted() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    FOR q IN
        SELECT DISTINCT n.queue FROM new_jobs n
        WHERE n.status = 'pending' AND n.run_at <= now() + interval '60 seconds'
    LOOP
        PERFORM pg_notify(TG_TABLE_SCHEMA, q);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE FUNCTION {{.schema}}.notify_updated() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA, NEW.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON {{.schema}}.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.notify_inserted();

-- Row level with a WHEN clause, so that the claimer's and completer's own
-- updates (to running, done or dead) never enter PL/pgSQL.
CREATE TRIGGER jobs_notify_update
    AFTER UPDATE OF status, run_at ON {{.schema}}.jobs
    FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.run_at <= now() + interval '60 seconds'
          AND (OLD.status IS DISTINCT FROM 'pending' OR OLD.run_at IS DISTINCT FROM NEW.run_at))
    EXECUTE FUNCTION {{.schema}}.notify_updated();
