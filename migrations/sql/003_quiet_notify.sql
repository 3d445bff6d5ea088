-- Notify only while a worker sleeps, and tune the jobs table for churn.
-- {{.schema}} is the schema identifier, already quoted by the migrator.
--
-- A transaction that has sent NOTIFY takes a database-wide lock at commit, so
-- every notifying writer in the cluster commits one at a time. The triggers
-- below notify only when a worker of the queue is asleep. The handshake
-- (docs/architecture.md, "Quiet writers"):
--   - a worker that is about to sleep takes the queue's sleep key exclusively,
--     at session level, and keeps it while it sleeps. That request waits for
--     every writer holding the key shared, so once granted, their rows are
--     committed; the worker then looks once more and sleeps;
--   - a writer tries to take the key shared until its commit. Granted: no
--     worker sleeps, and one that goes to sleep will wait for this commit and
--     then see the row, so no NOTIFY is needed. Refused: a worker sleeps or is
--     going to, so the writer notifies.
-- Advisory locks are not MVCC, so this holds in every isolation level.
-- Two keys that hash alike only cost extra notifications, never a lost one.

CREATE OR REPLACE FUNCTION {{.schema}}.notify_inserted() RETURNS trigger
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
        IF NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext(TG_TABLE_SCHEMA || '/' || q)) THEN
            PERFORM pg_notify(TG_TABLE_SCHEMA, q);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {{.schema}}.notify_updated() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(hashtext('pgdispatch.sleep'), hashtext(TG_TABLE_SCHEMA || '/' || NEW.queue)) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, NEW.queue);
    END IF;
    RETURN NULL;
END
$$;

-- Every claim and completion writes a new row version, and none can be HOT
-- (status is in the partial indexes' predicates). Room on each page keeps a
-- row's versions together, and autovacuum visits the table after a few
-- thousand changes rather than after a fifth of it, with no cost-based pauses:
-- the table is small when it is healthy, so a visit is short.
ALTER TABLE {{.schema}}.jobs SET (
    fillfactor = 80,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
